"""One real ``posfair serve`` (module scope): the OpenAI client and raw HTTP against it, a killed replica, a clean stop.

The server is the command as a shell runs it (forked by tests/forked.py), on a local Ray instance of its own, one
replica, serving a seeded tiny BERT saved as a sentence-transformers folder with e5-style prompts (``query: ``,
``passage: `` the default), calibrated 16,0.5,0.5, with an API key, per-request calibrations and ``--truncate``
(texts over the 64-token limit are truncated; the refusal of such a text without it is checked on the engine, in
test_engine.py).  The fixture watches it start: its URL printed as soon as the gateway answers, then 503 until the
model is loaded.  Every vector is checked against ``encode_cached`` of the same texts, model, calibration and prompt
in this process.  The last two tests kill the replica (SIGKILL, with requests in flight) and stop the server
(SIGTERM): they run in file order.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import select
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from forked import run_forked, server
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.encoding import encode_cached
from posfair.serve.deployments import BATCH_HEADER, PART_TEXTS, PASSES_HEADER, TRUNCATED_HEADER
from posfair.serve.openai_api import MAX_BODY_BYTES, MAX_TEXT_CHARS
from ray_sessions import session_of, session_processes, session_settles, sessions

pytestmark = [
    pytest.mark.timeout(300, method="thread"),
    pytest.mark.filterwarnings("ignore::posfair.calibration.coverage.CalibrationFallbackWarning"),
]

CAL = Calibration.parse("16,0.5,0.5")
LIMIT = 64
KEY_VAR, KEY = "POSFAIR_TEST_SERVE_KEY", "test-key-0123"
SECRET = "zanzibar-quokka-texts-are-never-logged"
PROMPTS = {"query": "query: ", "passage": "passage: "}
REPLICA = "ServeReplica:posfair:PosfairEncoder"  # the encoder replica's process title


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    stopped = False

    def __init__(self, run, url, session, loading, model, name):
        self.run, self.url, self.session, self.loading, self.model, self.name = (
            run, url, session, loading, model, name)  # fmt: skip

    def post(self, path: str, payload, key: str | None = KEY, raw: bytes | None = None, timeout: float = 60):
        """(status, headers, JSON body) of a POST."""
        data = raw if raw is not None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        return fetch(urllib.request.Request(self.url + path, data=data, headers=headers), timeout)

    def get(self, path: str, key: str | None = KEY):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return fetch(urllib.request.Request(self.url + path, headers=headers), 30)

    def embed(self, texts, **fields):
        status, _, body = self.post("/v1/embeddings", {"model": self.name, "input": texts, **fields})
        assert status == 200, body
        return np.array([d["embedding"] for d in body["data"]], dtype=np.float32), body


def fetch(req, timeout):
    """(status, headers (names in lower case), JSON body or the text of a body that is not JSON)."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, headers, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, e.headers, e.read()
    headers = {k.lower(): v for k, v in headers.items()}
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, raw.decode(errors="replace")


def declared_body(srv: Server, length: int) -> tuple[int, dict]:
    """(status, JSON body) of a POST that declares a body of ``length`` bytes and sends none of it."""
    host, port = srv.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def texts_of(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = "calibrated attention spreads the weight of a document evenly over its positions again".split()
    return [" ".join(rng.choice(words, size=int(rng.integers(2, 40)))) for _ in range(n)]


@pytest.fixture(scope="module")
def model_folder(tiny_model_path, tmp_path_factory):
    """The tiny BERT as a sentence-transformers folder with e5's prompts ('passage: ' by default)."""
    import posfair

    path, pooling = tiny_model_path("bert")
    model = posfair.load_model(path, pooling=pooling, max_seq_length=LIMIT)
    model.prompts, model.default_prompt_name = dict(PROMPTS), "passage"
    out = tmp_path_factory.mktemp("serve") / "tiny-e5"
    model.save(str(out))
    return out


@pytest.fixture(scope="module")
def local_model(model_folder):
    import posfair

    return posfair.load_model(model_folder, max_seq_length=LIMIT)


@pytest.fixture(scope="module")
def srv(model_folder, local_model, tmp_path_factory):
    port = free_port()
    os.environ[KEY_VAR] = KEY
    args = ["serve", "--model", str(model_folder), "--max-seq-length", str(LIMIT), "--calibration", "16,0.5,0.5",
            "--port", str(port), "--api-key-env", KEY_VAR, "--request-calibration", "--max-batch-tokens", "256",
            "--truncate"]  # fmt: skip
    before = sessions()
    # a module's fixture starts before the tests' own width (conftest): give the server whole lines here too
    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "1000"
    try:
        run = server().start(args, tmp_path_factory.mktemp("serve-cwd"))
    finally:
        os.environ.pop("COLUMNS") if width is None else os.environ.__setitem__("COLUMNS", width)
    url, srv = f"http://127.0.0.1:{port}", None
    try:
        deadline = time.monotonic() + 240

        def printed(what: str) -> bool:
            assert time.monotonic() < deadline, f"the server did not print {what!r} in time"
            err = run.err.read_text() if run.err.exists() else ""
            assert "error:" not in err, err
            return what in (run.out.read_text() if run.out.exists() else "")

        while not printed(f"listening on {url}"):
            time.sleep(0.1)
        # from the URL on: /health and /v1/embeddings, in turn, until /health answers 200 (the model is loaded)
        loading, payload = [], {"model": str(model_folder), "input": "a text"}
        auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        while not loading or loading[-2][:2] != ("/health", 200):
            for path, data in (("/health", None), ("/v1/embeddings", json.dumps(payload).encode())):
                loading.append((path, *fetch(urllib.request.Request(url + path, data=data, headers=auth), 30)))
            assert time.monotonic() < deadline, loading[-2:]
            time.sleep(0.1)
        while not printed("serving"):
            time.sleep(0.1)
        srv = Server(run, url, session_of(run.pid, before), loading, local_model, str(model_folder))
        yield srv
    finally:
        os.environ.pop(KEY_VAR, None)
        if srv is None or not srv.stopped:  # the last test stops it itself
            os.kill(run.pid, signal.SIGTERM)
            server().wait(run, timeout=120)


def test_health_and_models(srv):
    out = srv.run.out.read_text()
    assert "Ctrl-C stops it" in out and out.index(f"listening on {srv.url}") < out.index(f"at {srv.url} "), out
    err = srv.run.err.read_text() if srv.run.err.exists() else ""
    assert "SIGTERM handler is not set" not in err, err  # Ray's notice of its start off the main thread (issue 57)
    assert srv.get("/health", key=None)[0] == 200


def test_the_url_is_printed_while_the_model_loads_and_answers_503_until_it_is_loaded(srv):
    """From the moment the URL is printed, /health and /v1/embeddings answer 503 (OpenAI's error shape) while the
    model replicas load, then 200: never 404 (no gateway yet), never a 200 before the model is loaded.  (One
    composed application: the gateway and the replica start together, and the tiny model loads within a second,
    so the 503s may be over before the first request; the killed-replica test sees them while a replica loads.)"""
    statuses = [status for _, status, _, _ in srv.loading]
    assert set(statuses) <= {503, 200}, statuses
    assert statuses == sorted(statuses, key=lambda s: s == 200), statuses  # 503 ... 503 200 ... 200
    for path in ("/health", "/v1/embeddings"):
        first = next(x for x in srv.loading if x[0] == path)
        if first[1] == 503:
            assert first[3]["error"]["code"] == "service_unavailable", first
            assert set(first[3]["error"]) == {"message", "type", "param", "code"}
            assert "loading" in first[3]["error"]["message"] and first[2].get("retry-after") == "1"
    status, _, body = srv.get("/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [srv.name]


def test_openai_client_gets_encodes_vectors_and_usage_whatever_the_batching(srv):
    """The official client (base64 on the wire, its default) from 8 threads at once: requests batched together
    by the server; each answer equals encode_cached of its own texts with the server's calibration."""
    import openai

    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    batches = [texts_of(1 + i % 4, seed=i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda t: client.embeddings.create(model=srv.name, input=t), batches))
    for texts, ans in zip(batches, answers, strict=True):
        got = np.array([d.embedding for d in sorted(ans.data, key=lambda d: d.index)], dtype=np.float32)
        np.testing.assert_allclose(got, encode_cached(srv.model, texts, calibration=CAL), rtol=0, atol=1e-5)
        lengths = [len(ids) for ids in srv.model.tokenizer(["passage: " + t for t in texts])["input_ids"]]
        assert ans.usage.prompt_tokens == ans.usage.total_tokens == sum(lengths)
        assert ans.model == srv.name


def test_raw_http_float_and_base64_give_the_same_floats(srv):
    texts = texts_of(3, seed=11)
    floats, body = srv.embed(texts)
    status, _, b64 = srv.post("/v1/embeddings", {"model": srv.name, "input": texts, "encoding_format": "base64"})
    assert status == 200 and body["object"] == "list" and [d["index"] for d in body["data"]] == [0, 1, 2]
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in b64["data"]])
    np.testing.assert_array_equal(decoded, floats)
    one, _ = srv.embed(texts[0])  # a string is one input
    np.testing.assert_allclose(one, floats[:1], rtol=0, atol=1e-5)  # alone: other padding


def test_request_calibration_and_prompt_name(srv):
    texts = texts_of(3, seed=5)
    stock, _ = srv.embed(texts, calibration="stock")
    other, _ = srv.embed(texts, calibration="8,1,1")
    query, _ = srv.embed(texts, prompt_name="query")
    np.testing.assert_allclose(stock, encode_cached(srv.model, texts, calibration=STOCK), rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        other, encode_cached(srv.model, texts, calibration=Calibration.parse("8,1,1")), rtol=0, atol=1e-5
    )
    want = encode_cached(srv.model, texts, calibration=CAL, prompt="query: ")
    np.testing.assert_allclose(query, want, rtol=0, atol=1e-5)
    assert np.abs(stock - query).max() > 1e-3  # the settings changed the vectors


def test_segments_are_late_chunking_of_the_whole_document(srv):
    """Stock: posfair's LateChunking of the joined document over the segments' spans; calibrated: the mean of
    the calibrated token states over each segment's tokens, computed here by hand."""
    from posfair.model.token_spans import join_segments
    from posfair.retrieval.late import LateChunking

    segs = [
        "The first section of this report talks about calibrated attention in long documents.",
        "The second one, about positional bias and its repair.",
        "And a third, short.",
    ]
    doc, spans = join_segments(segs)
    status, _, body = srv.post("/v1/segments", {"model": srv.name, "input": segs, "calibration": "stock"})
    assert status == 200 and [d["index"] for d in body["data"]] == [0, 1, 2], body
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = LateChunking(chunks=8)._compute(srv.model, [doc], [spans])[0]
    np.testing.assert_allclose(got, unit(want), rtol=0, atol=1e-5)  # unit length by default, as encode's vectors
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=0, atol=1e-5)
    payload = {"model": srv.name, "input": segs, "calibration": "stock", "normalize": False}
    raw = np.array([d["embedding"] for d in srv.post("/v1/segments", payload)[2]["data"]], dtype=np.float32)
    np.testing.assert_allclose(raw, want, rtol=0, atol=1e-5)  # normalize false: the plain mean of token states
    # calibrated (the server's calibration): token states of one pass, averaged by hand over each segment's tokens
    status, _, body = srv.post("/v1/segments", {"model": srv.name, "input": segs, "normalize": False})
    cal_got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    states = srv.model.encode([doc], output_value="token_embeddings", calibration=CAL)[0].numpy()
    enc = srv.model.tokenizer("passage: " + doc, return_offsets_mapping=True)
    shift = len("passage: ")
    for k, (a, b) in enumerate(spans):
        rows = [i for i, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s - shift < b and e - shift > a]
        np.testing.assert_allclose(cal_got[k], states[rows].mean(axis=0), rtol=0, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == len(enc["input_ids"])


def truncated(model, text: str, prompt: str = "passage: ") -> str:
    """The longest start of ``text`` whose tokens, with the prompt and the special tokens, fit the token limit."""
    enc = model.tokenizer(prompt + text, return_offsets_mapping=True, truncation=True, max_length=LIMIT)
    cut = text[: max(e for s, e in enc["offset_mapping"] if e > s) - len(prompt)]
    assert len(model.tokenizer(prompt + cut)["input_ids"]) == LIMIT < len(model.tokenizer(prompt + text)["input_ids"])
    return cut


def test_truncate_encodes_the_truncated_text_and_says_so_in_a_header(srv):
    """--truncate: a text over the 64-token limit gets the vector encode gives the start of it that fits, the
    answer's X-Posfair-Truncated header counts such texts, and usage counts the tokens encoded."""
    long, short = "word " * 100, "a short text"
    status, headers, body = srv.post("/v1/embeddings", {"model": srv.name, "input": [long, short]})
    assert status == 200 and headers.get(TRUNCATED_HEADER.lower()) == "1", (status, headers, body)
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = encode_cached(srv.model, [truncated(srv.model, long), short], calibration=CAL)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == LIMIT + len(srv.model.tokenizer("passage: " + short)["input_ids"])
    status, headers, _ = srv.post("/v1/embeddings", {"model": srv.name, "input": [short]})
    assert status == 200 and TRUNCATED_HEADER.lower() not in headers


def test_truncate_gives_a_long_documents_segments_late_chunking_of_its_start(srv):
    """--truncate at /v1/segments: a document over the limit is cut there (the header says 1), each segment's
    vector is the late chunking of the document's start that fits (its last segment cut short)."""
    from posfair.model.token_spans import join_segments
    from posfair.retrieval.late import LateChunking

    segs = ["The first section of the report. " * 4, "The second section, cut by the limit. " * 4]
    doc, spans = join_segments(segs)
    cut = truncated(srv.model, doc)
    status, headers, body = srv.post("/v1/segments", {"model": srv.name, "input": segs, "calibration": "stock"})
    assert status == 200 and headers.get(TRUNCATED_HEADER.lower()) == "1", (status, headers, body)
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    want = unit(LateChunking(chunks=8)._compute(srv.model, [cut], [[(a, min(b, len(cut))) for a, b in spans]])[0])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == LIMIT


def test_segments_requests_arriving_together_share_forward_passes(srv):
    """12 /v1/segments requests at once (stock and the server's calibration, in turn): each gets the vectors it gets
    alone (and, stock, posfair's late chunking), in fewer forward passes than requests -- each answer says how many
    requests its batch held and how many passes that batch took, so the passes add up to sum(passes / requests)."""
    from posfair.model.token_spans import join_segments
    from posfair.retrieval.late import LateChunking

    rng = np.random.default_rng(7)
    words = "late chunking pools the token states of a whole document over each of its segments".split()
    docs = [[" ".join(rng.choice(words, size=int(rng.integers(2, 7)))) for _ in range(2 + i % 3)] for i in range(12)]
    payloads = [
        {"model": srv.name, "input": d, **({"calibration": "stock"} if i % 2 else {})} for i, d in enumerate(docs)
    ]
    alone = [srv.post("/v1/segments", p) for p in payloads]
    with ThreadPoolExecutor(len(payloads)) as pool:
        together = list(pool.map(lambda p: srv.post("/v1/segments", p), payloads))
    for i, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert a[0] == t[0] == 200, (a, t)
        vecs = [np.array([d["embedding"] for d in x[2]["data"]], dtype=np.float32) for x in (a, t)]
        np.testing.assert_allclose(vecs[1], vecs[0], rtol=0, atol=1e-5)
        if i % 2:
            doc, spans = join_segments(docs[i])
            want = unit(LateChunking(chunks=8)._compute(srv.model, [doc], [spans])[0])
            np.testing.assert_allclose(vecs[1], want, rtol=0, atol=1e-5)
    assert {(a[1][BATCH_HEADER.lower()], a[1][PASSES_HEADER.lower()]) for a in alone} == {("1", "1")}
    sizes = [int(t[1][BATCH_HEADER.lower()]) for t in together]
    passes = sum(Fraction(int(t[1][PASSES_HEADER.lower()]), int(t[1][BATCH_HEADER.lower()])) for t in together)
    assert max(sizes) > 1 and passes.denominator == 1 and passes < len(payloads), (sizes, passes)


def test_bad_requests_get_the_openai_error_shape(srv):
    name = srv.name
    cases = [
        (dict(raw=b'{"model": '), 400, None),
        (dict(payload={"model": name, "input": 7}), 400, "input"),
        (dict(payload={"model": name, "input": []}), 400, "input"),
        (dict(payload={"model": name, "input": ["a"] * 2049}), 400, "input"),
        (dict(payload={"model": name, "input": "x", "prompt_name": "nope"}), 400, "prompt_name"),
        (dict(payload={"model": name, "input": "x", "calibration": "16,0.5,0.5,prior=/etc/hosts"}), 400, "calibration"),
        (dict(payload={"model": name, "input": "x", "calibration": "16,99,1"}), 400, "calibration"),
        (dict(payload={"model": "bundled", "input": "x"}), 404, "model"),
        (dict(payload={"model": name, "input": "x"}, key=None), 401, None),
        (dict(payload={"model": name, "input": "x"}, key="wrong"), 401, None),
    ]
    for kwargs, status, param in cases:
        got, _, body = srv.post("/v1/embeddings", kwargs.pop("payload", None), **kwargs)
        assert got == status and set(body["error"]) == {"message", "type", "param", "code"}, (kwargs, got, body)
        assert body["error"]["param"] == param, body
    assert srv.get("/v1/models", key=None)[0] == 401
    # a body over the limit is refused on its declared length, before it is read
    status, body = declared_body(srv, MAX_BODY_BYTES + 1)
    assert status == 413 and body["error"]["code"] == "request_too_large", body
    # --truncate: a segment wholly beyond the 64-token limit has no token state to pool
    over, _, body = srv.post("/v1/segments", {"model": name, "input": ["word " * 70, "more"]})
    assert over == 400 and body["error"]["param"] == "input" and "beyond the token limit" in body["error"]["message"]


def test_no_request_text_is_logged(srv):
    """A text sent in a request (served, or refused) appears in none of the server's output or Ray's logs."""
    srv.embed([SECRET + " one"])
    srv.post("/v1/embeddings", {"model": srv.name, "input": [SECRET + " " * 3, 5]})
    srv.post("/v1/embeddings", {"model": srv.name, "input": [SECRET + " x" * 100]})
    time.sleep(1)  # log files flushed
    found = [p for p in (srv.run.out, srv.run.err) if SECRET in p.read_text(errors="replace")]
    for p in srv.session.rglob("*"):
        if p.is_file() and not p.is_symlink() and "sockets" not in p.parts:
            try:
                if SECRET.encode() in p.read_bytes():
                    found.append(p)
            except OSError:
                pass
    assert not found, found


def test_a_serve_instance_already_on_the_cluster_is_named_and_refused(srv, tmp_path):
    """--ray-address with Ray Serve already running there (this module's server): refused with one error line naming
    the instance's address and the posfair server on it, exit 2, before the model loads; that server is untouched.
    (Serve elsewhere on a cluster, without a posfair server: test_engine.py, on serve_conflict.)"""
    (gcs_port,) = [p.read_text().strip() for p in srv.session.glob("gcs_server_port_*")]
    address = f"127.0.0.1:{gcs_port}"
    with pytest.MonkeyPatch.context() as mp:  # a local Ray instance uses token authentication (~/.ray/auth_token)
        mp.setenv("RAY_AUTH_MODE", "token")
        res = run_forked(["serve", "--model", srv.name, "--ray-address", address, "--port", str(free_port())], tmp_path)
    assert res.returncode == 2 and res.stderr.startswith(f"error: --ray-address {address}: "), res
    assert f"Ray Serve already runs on this cluster, listening at {srv.url} with a posfair server" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "starting" not in res.stdout, res
    assert srv.get("/health", key=None)[0] == 200


def raw_post(srv: Server, path: str, body: bytes, headers: dict | None = None):
    """(status, headers, JSON body or text) of a POST of ``body`` as given, the key sent, JSON its type unless
    ``headers`` says otherwise."""
    head = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
    return fetch(urllib.request.Request(srv.url + path, data=body, headers=head, method="POST"), 60)


def test_hostile_requests_get_400_in_openai_shape_and_read_no_file(srv, tmp_path):
    """Issue 48, defects 1-4 over HTTP: each of these was a 500 in plain text, a file read, or ignored; now a 400 in
    OpenAI's error shape naming the field."""
    secret = tmp_path / "prior.json"
    secret.write_text(json.dumps({"secret_field": 1}))
    name = srv.name
    cases = [
        (b'{"model": "' + name.encode() + b'", "input": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", None),
        (json.dumps({"model": name, "input": "x"}).encode()[:-1] + b', "dimensions": ' + b"9" * 5000 + b"}", None),
        (json.dumps({"model": name, "input": "x", "dimensions": 10**30}).encode(), "dimensions"),
        (json.dumps({"model": name, "input": "x", "dimensions": 32}).encode(), "dimensions"),  # the model's is 64
        (json.dumps({"model": name, "input": "x", "calibration": f"{10**22},1,1"}).encode(), "calibration"),
        (json.dumps({"model": name, "input": ["ok", "\ud800"]}).encode(), "input"),
        (json.dumps({"model": name, "input": ["ok", "\u0000"]}).encode(), "input"),
    ]
    for space in ("\t", "\n", "\u00a0", "\u3000"):
        spec = f"16,1.0,1,prior{space}={secret}"
        cases.append((json.dumps({"model": name, "input": "x", "calibration": spec}).encode(), "calibration"))
    for raw, param in cases:
        status, headers, body = raw_post(srv, "/v1/embeddings", raw)
        assert status == 400 and headers["content-type"].startswith("application/json"), (raw[:80], status, body)
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["param"] == param, body
        assert "secret_field" not in body["error"]["message"]
    own, _ = srv.embed(["a text"], dimensions=64)
    assert own.shape == (1, 64)


def test_a_bad_request_never_fails_the_others_batched_with_it(srv):
    """Defect 2: requests holding a lone surrogate, sent together with good ones, made the good ones batched with
    them fail (500). Now each bad one gets its 400 and every good one its vectors."""
    good = [texts_of(2, seed=60 + i) for i in range(12)]
    bad = json.dumps({"model": srv.name, "input": ["fine", "\ud800 bad"]}).encode()
    jobs = [("good", g) for g in good] + [("bad", None)] * 4
    jobs = jobs[::2] + jobs[1::2]

    def send(job):
        kind, texts = job
        if kind == "bad":
            return kind, texts, raw_post(srv, "/v1/embeddings", bad)
        return kind, texts, srv.post("/v1/embeddings", {"model": srv.name, "input": texts})

    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(send, jobs))
    for kind, texts, (status, _, body) in results:
        if kind == "bad":
            assert status == 400 and body["error"]["param"] == "input", body
            continue
        assert status == 200, body
        got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
        np.testing.assert_allclose(got, encode_cached(srv.model, texts, calibration=CAL), rtol=0, atol=1e-5)


def test_only_json_from_no_web_page_and_no_redirect(srv):
    """A web page cannot drive the server: a 'simple' cross-origin POST (text/plain) is refused (415), so is any
    request with an Origin not allowed by --cors-origin (403; none by default), and the CORS preflight (403). A
    compressed body is refused as such (415), and /v1/embeddings/ is a 404 in OpenAI's shape, not a 307 built
    from the Host header."""
    payload = json.dumps({"model": srv.name, "input": "a text"}).encode()
    status, _, body = raw_post(srv, "/v1/embeddings", payload, {"Content-Type": "text/plain"})
    assert status == 415 and body["error"]["code"] == "unsupported_media_type", body
    status, _, body = raw_post(srv, "/v1/embeddings", payload, {"Origin": "https://evil.example"})
    assert status == 403 and "--cors-origin" in body["error"]["message"], body
    status, _, body = raw_post(srv, "/v1/embeddings", payload, {"Content-Encoding": "gzip"})
    assert status == 415 and "compressed" in body["error"]["message"], body
    pre = urllib.request.Request(
        srv.url + "/v1/embeddings",
        method="OPTIONS",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    status, headers, body = fetch(pre, 30)
    assert status == 403 and "access-control-allow-origin" not in headers, (status, headers)
    status, headers, body = raw_post(srv, "/v1/embeddings/", payload, {"Host": "evil.example"})
    assert status == 404 and "location" not in headers and body["error"]["code"] == "not_found", (status, headers)


def test_a_long_request_goes_in_parts_and_short_texts_are_counted(srv):
    """A request of 150 texts (three parts on the way to the replica) gets encode's vectors in order; texts the
    calibration (B=16) leaves stock, being shorter than one basket, are counted in X-Posfair-Stock-Short."""
    from posfair.serve.deployments import SHORT_HEADER

    texts = texts_of(150, seed=70)
    status, headers, body = srv.post("/v1/embeddings", {"model": srv.name, "input": texts})
    assert status == 200 and [d["index"] for d in body["data"]] == list(range(150))
    got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    np.testing.assert_allclose(got, encode_cached(srv.model, texts, calibration=CAL), rtol=0, atol=1e-5)
    cov = srv.model.calibration_coverage(texts, CAL, prompt="passage: ")
    assert cov.fallen_back > 0 and headers.get(SHORT_HEADER.lower()) == str(cov.fallen_back), headers
    lengths = [len(ids) for ids in srv.model.tokenizer(["passage: " + t for t in texts])["input_ids"]]
    assert body["usage"]["prompt_tokens"] == sum(lengths)


def test_the_key_is_in_no_ray_process_environment(srv):
    """--api-key-env: the key is read by the command and kept out of the environment of every Ray process."""
    procs = [p for p in session_processes(srv.session) if int(p.split()[0]) != srv.run.pid]  # posfair read it
    assert any(REPLICA in p for p in procs), procs
    for line in procs:
        pid = line.split()[0]
        try:
            env = open(f"/proc/{pid}/environ", "rb").read()
        except OSError:
            continue
        assert KEY.encode() not in env, line


def listening_addresses(pids: list[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every listening TCP socket the processes ``pids`` hold (from /proc: no psutil)."""
    inodes = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = pid
        except OSError:  # ended meanwhile
            continue
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr = fields[1].split(":")[0]
            raw = b"".join(bytes.fromhex(hexaddr[i : i + 8])[::-1] for i in range(0, width, 8))
            found.append((inodes[fields[9]], str(ipaddress.ip_address(raw))))
    return found


def test_rays_own_ports_listen_on_the_loopback_only(srv):
    """Issue 48: with --host 127.0.0.1, Ray's GCS, raylet and replica ports listened on every interface; now every
    listening socket of the server's Ray instance (and of the command) is on the loopback."""
    pids = [int(p.split()[0]) for p in session_processes(srv.session)] + [srv.run.pid]
    found = listening_addresses(pids)
    names = {Path(f"/proc/{pid}/comm").read_text().strip() for pid, _ in found}
    (replica,) = (int(p.split()[0]) for p in session_processes(srv.session, (REPLICA,)))
    assert {"gcs_server", "raylet"} <= names and replica in {pid for pid, _ in found}, (names, found)
    wide = [(pid, a) for pid, a in found if not loopback(a)]
    assert not wide, wide


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_serves_own_paths_ask_the_key(srv):
    """Issue 48: Ray Serve's /-/routes answered without the key; now it asks it, 401 in OpenAI's shape, and answers
    with it.  Serve's /-/healthz stays open, as /health: KubeRay asks it without a key."""
    status, headers, body = srv.get("/-/routes", key=None)
    assert status == 401 and body["error"]["code"] == "invalid_api_key", (status, body)
    assert srv.get("/-/routes", key="wrong")[0] == 401
    status, _, body = srv.get("/-/routes")
    assert status == 200 and body == {"/": "posfair"}, body
    assert srv.get("/health", key=None)[0] == 200  # the gateway's health stays open to a supervisor
    with urllib.request.urlopen(srv.url + "/-/healthz", timeout=30) as r:  # Serve's: "success", no key
        assert r.status == 200 and r.read() == b"success"


def raw_exchange(srv: Server, raw: bytes, chunk: int = 4096, pause: float = 0.05) -> tuple[int, dict, float]:
    """(status, OpenAI error body, seconds) of ``raw`` sent ``chunk`` bytes at a time, ``pause`` s apart, until the
    server answers and closes."""
    host, port = srv.url.removeprefix("http://").split(":")
    t0 = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=60) as s:
        for start in range(0, len(raw), chunk):
            if select.select([s], [], [], pause)[0]:
                break
            s.sendall(raw[start : start + chunk])
        answer = b""
        while data := s.recv(65536):
            answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"application/json" in head.lower(), head
    return int(head.split()[1]), json.loads(body)["error"], time.monotonic() - t0


def test_header_limits_and_a_header_timeout(srv):
    """Issue 48: 10,000 headers and a 1 MiB header got 200, and connections dripping a header a byte a second were
    held for a minute; now 431 and 408 in OpenAI's error shape (posfair.serve.proxy, in Serve's HTTP proxy)."""
    from posfair.serve.proxy import HEAD_TIMEOUT_S

    line = f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n".encode()
    for extra in (b"".join(b"X-H%d: v\r\n" % i for i in range(10_000)), b"X-Big: " + b"a" * 2**20 + b"\r\n"):
        status, err, _ = raw_exchange(srv, line + extra + b"\r\n")
        assert status == 431 and err["code"] == "request_header_fields_too_large", (status, err)
    status, err, took = raw_exchange(srv, line + b"X-Slow: " + b"a" * 100, chunk=1, pause=0.5)
    assert status == 408 and err["code"] == "request_timeout", (status, err)
    assert took < HEAD_TIMEOUT_S + 5, took
    assert srv.embed(["still served"])[0].shape == (1, 64)


def test_a_short_segments_document_is_said_stock_in_a_header(srv):
    """A /v1/segments document shorter than one basket (B=16) comes back stock under the server's calibration: the
    X-Posfair-Stock-Short header says so (as at /v1/embeddings); stock by request, or long enough: no header."""
    from posfair.serve.deployments import SHORT_HEADER

    short = {"model": srv.name, "input": ["Two words.", "Three more."]}
    status, headers, body = srv.post("/v1/segments", short)
    assert status == 200 and headers.get(SHORT_HEADER.lower()) == "1", (status, headers, body)
    status, headers, _ = srv.post("/v1/segments", {**short, "calibration": "stock"})
    assert status == 200 and SHORT_HEADER.lower() not in headers, headers
    segs = ["The first section of this report talks about calibrated attention in long documents.", "A second."]
    status, headers, _ = srv.post("/v1/segments", {"model": srv.name, "input": segs})
    assert status == 200 and SHORT_HEADER.lower() not in headers, headers


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def all_stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (a SIGSTOP sent to it has landed)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return all(state in "tT" for state in states)


def heavy_texts(n: int, seed: int) -> list[str]:
    """``n`` texts of MAX_TEXT_CHARS punctuation marks, one token each: encoding a part of them (``PART_TEXTS``) costs
    the replica a second or more of CPU (each text tokenised whole, 65,536 tokens, before ``--truncate`` keeps 64)."""
    rng = np.random.default_rng(seed)
    return ["".join(rng.choice(list(".,;:!?-()"), size=MAX_TEXT_CHARS)) for _ in range(n)]


def test_a_killed_replica_gives_503_in_flight_then_a_new_replica_answers(srv):
    """A request whose part the replica is computing when the replica is killed (SIGKILL) gets 503; Ray Serve
    starts a new replica and later requests get the right vectors.

    Ray Serve sends a part again, to the next replica, when its replica died before taking it: a kill that lands
    between two parts gets the request a 200.  So the kill lands while a part is computed, and the test shows it
    does: one part of heavy texts is measured first (the replica CPU it costs), then a request of two such parts is
    sent; once the replica has spent a quarter of a part's CPU on it, the replica is stopped (SIGSTOP, so it can do
    no more), found to have spent less than three quarters of a part (its first part unfinished) with the request
    unanswered, and killed as it stands."""
    (pid_cmd,) = session_processes(srv.session, (REPLICA,))
    pid = int(pid_cmd.split()[0])
    texts = texts_of(2, seed=21)
    want = encode_cached(srv.model, texts, calibration=CAL)
    before = cpu_seconds(pid)
    status, _, body = srv.post("/v1/embeddings", {"model": srv.name, "input": heavy_texts(PART_TEXTS, 3)}, timeout=120)
    assert status == 200 and len(body["data"]) == PART_TEXTS, body
    part = cpu_seconds(pid) - before  # the replica's CPU for one part of heavy texts
    big = {"model": srv.name, "input": heavy_texts(2 * PART_TEXTS, 4)}  # two parts
    with ThreadPoolExecutor(1) as pool:
        start = cpu_seconds(pid)
        answer = pool.submit(srv.post, "/v1/embeddings", big, timeout=120)
        deadline = time.monotonic() + 60
        while cpu_seconds(pid) - start < part / 4 and not answer.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        while not all_stopped(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        spent, answered = cpu_seconds(pid) - start, answer.done()  # frozen: the replica is stopped
        os.kill(pid, signal.SIGKILL)
        assert not answered, f"the request was answered before the replica was killed: {answer.result()[:1]}"
        assert part / 4 <= spent < part * 3 / 4, f"the replica spent {spent:.2f} s on the request, a part {part:.2f} s"
        status, _, body = answer.result(timeout=150)
    assert status == 503 and body["error"]["code"] == "service_unavailable", (status, body)
    status, headers, body = srv.get("/health", key=None)  # while the new replica loads the model: at once
    assert status == 503 and body["error"]["code"] == "service_unavailable" and headers.get("retry-after") == "1"
    status, _, body = srv.post("/v1/embeddings", {"model": srv.name, "input": texts}, timeout=10)
    assert status == 503 and "loading" in body["error"]["message"], body  # answered, not queued (defect 8)
    deadline, statuses = time.monotonic() + 120, []
    while time.monotonic() < deadline:
        status, _, body = srv.post("/v1/embeddings", {"model": srv.name, "input": texts}, timeout=120)
        statuses.append(status)
        if status == 200:
            break
        assert status == 503, body
        time.sleep(1)
    assert statuses[-1] == 200, statuses
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), want, rtol=0, atol=1e-5)
    new = session_processes(srv.session, (REPLICA,))
    assert len(new) == 1 and int(new[0].split()[0]) != pid


def test_sigterm_stops_the_server_and_its_ray_instance(srv):
    """SIGTERM: the server stops with "stopped", exit 0, its Ray instance gone; requests sent meanwhile get their
    answer, or 503 in OpenAI's shape ("stopping"), or no connection -- never Ray's 404 text (defect 7)."""
    seen, done = [], threading.Event()

    def hammer():
        while not done.is_set():
            try:
                seen.append(srv.post("/v1/embeddings", {"model": srv.name, "input": "a text"}, timeout=30))
            except OSError:  # refused: the proxy is gone
                seen.append((None, {}, None))
            time.sleep(0.05)

    sender = threading.Thread(target=hammer)
    sender.start()
    time.sleep(0.3)
    os.kill(srv.run.pid, signal.SIGTERM)
    srv.stopped = True
    try:
        res = server().wait(srv.run, timeout=120)
    finally:
        done.set()
        sender.join(60)
    for status, _, body in seen:
        assert status in (200, 503, None), (status, body)
        if status == 503:
            assert body["error"]["code"] == "service_unavailable", body
    assert res.returncode == 0 and res.stdout.rstrip().endswith("stopped"), (res.stdout, res.stderr)
    left = session_settles(srv.session, timeout=60)
    assert not left, f"the server's Ray instance outlived it: {left}"
    assert "SIGTERM received" not in res.stderr, res.stderr  # Ray's stack dump is not what stops it


def test_bad_options_are_refused_before_anything_loads(tmp_path, model_folder):
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        cases = [
            (["serve", "--port", str(port)], "--port"),
            (["serve", "--port", "0"], "--port"),
            (["serve", "--api-key-env", "POSFAIR_TEST_UNSET_VAR"], "--api-key-env"),
            (["serve", "--model", str(tmp_path / "missing")], "--model"),
            (["serve", "--host", "no-such-host.invalid"], "--host"),
            (["serve", "--calibration", "16,0.5"], "--calibration"),
        ]
        for args, option in cases:
            res = run_forked(args, tmp_path)
            assert res.returncode == 2 and res.stderr.startswith("error: ") and option in res.stderr, (args, res)
            assert "starting" not in res.stdout, res.stdout  # refused before the model or Ray
