"""``posfair serve`` without Ray: the request checks (protocol) and what a replica computes (engine).

The server test (tests/serve/test_server.py) checks the same through HTTP; here the cases it cannot reach with
its one server: truncation (``--truncate``), a calibration refused by a server that allows none per request,
and the token-budget batching of many requests at once, against ``encode`` one request at a time.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from posfair import Calibration
from posfair.calibration import STOCK
from posfair.distributed.spec import EmbedSpec
from posfair.encoding import encode_cached
from posfair.serve.engine import Engine
from posfair.serve.openai_api import MAX_INPUTS, ApiError, EmbeddingRequest, embedding_response, parse_request

CAL = Calibration.parse("16,0.5,0.5")
LIMIT = 64


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    import posfair

    path, pooling = tiny_model_path("bert")
    return posfair.load_model(path, pooling=pooling, max_seq_length=LIMIT), EmbedSpec(
        model=str(path), pooling=pooling, max_seq_length=LIMIT, calibration=CAL.to_dict(), max_batch_tokens=96
    )


def body(**fields) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


@pytest.mark.parametrize(
    ("raw", "status", "param", "says"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "must be a JSON object; got a list"),
        (body(input="x", extra=1), 400, "extra", "unknown field"),
        (body(input=3), 400, "input", "a string or a list of strings; got a number"),
        (body(input=[]), 400, "input", "is empty"),
        (body(input=["ok", " "]), 400, "input", "input 1 is empty"),
        (body(input=[[101, 102]]), 400, "input", "input 0 is a list, not a string"),
        (body(input=["a"] * (MAX_INPUTS + 1)), 400, "input", f"at most {MAX_INPUTS}"),
        (body(input="x", encoding_format="int8"), 400, "encoding_format", "'float' or 'base64'"),
        (body(input="x", calibration="16,1,1,prior=/etc/passwd"), 400, "calibration", "reads no file"),
        (body(input="x", prompt_name=""), 400, "prompt_name", "prompts"),
        (json.dumps({"model": "other", "input": "x"}).encode(), 404, "model", "not served here"),
        (json.dumps({"input": "x"}).encode(), 400, "model", "must be a string"),
    ],
)
def test_malformed_requests_are_refused_in_openai_error_shape(raw, status, param, says):
    with pytest.raises(ApiError) as err:
        parse_request(raw, "m")
    assert err.value.status == status and err.value.param == param and says in err.value.message, err.value
    shape = err.value.body()["error"]
    assert set(shape) == {"message", "type", "param", "code"}


def test_no_refusal_quotes_a_text():
    secret = "confidential-sentence-4711"
    for raw in (body(input=[secret, 5]), body(input={"t": secret}), body(input=secret, encoding_format=secret * 3)):
        with pytest.raises(ApiError) as err:
            parse_request(raw, "m")
        assert secret not in err.value.message


def test_a_string_input_is_one_text_and_segments_need_a_list():
    assert parse_request(body(input="one text"), "m").texts == ("one text",)
    with pytest.raises(ApiError, match="document's segments"):
        parse_request(body(input="one text"), "m", segments=True)


def test_base64_is_little_endian_float32_of_the_same_vector():
    v = np.array([[0.5, -1.25, 3.0e-8]], dtype=np.float32)
    b64 = embedding_response(v, "base64", "m", 3)["data"][0]["embedding"]
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(b64), dtype="<f4"), v[0])
    assert embedding_response(v, "float", "m", 3)["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def texts_of(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = "posfair measures and repairs positional bias in text embedding models of many kinds".split()
    return [" ".join(rng.choice(words, size=int(rng.integers(2, 30)))) for _ in range(n)]


def test_requests_batched_together_get_the_vectors_encode_gives_each_alone(tiny):
    """Several requests answered by one embed_many (token-budget batches of 96 padded tokens, sorted by length,
    shared between requests of the same calibration) equal encode_cached of each request alone."""
    model, spec = tiny
    engine = Engine(model, spec, request_calibration=True)
    reqs = [
        EmbeddingRequest(tuple(texts_of(5, 1))),
        EmbeddingRequest(tuple(texts_of(3, 2)), calibration="stock"),
        EmbeddingRequest(tuple(texts_of(7, 3))),
        EmbeddingRequest(("x " * 80,)),  # over the 64-token limit: refused alone, the others are served
    ]
    answers = engine.embed_many(reqs)
    assert answers[3].status == 400 and answers[3].error["error"]["code"] == "context_length_exceeded"
    for req, ans, cal in zip(reqs[:3], answers[:3], (CAL, STOCK, CAL), strict=True):
        want = encode_cached(model, list(req.texts), calibration=cal)
        assert ans.status == 200 and ans.vectors.shape == want.shape
        np.testing.assert_allclose(ans.vectors, want, rtol=0, atol=1e-5)
        assert ans.tokens == sum(len(ids) for ids in model.tokenizer(list(req.texts))["input_ids"])


def test_truncation_is_counted_and_gives_the_truncated_texts_vectors(tiny):
    model, spec = tiny
    long = ["word " * 100, "short text"]
    (ans,) = Engine(model, spec, truncate=True).embed_many([EmbeddingRequest(tuple(long))])
    assert ans.truncated == 1 and ans.tokens == LIMIT + len(model.tokenizer("short text")["input_ids"])
    np.testing.assert_allclose(ans.vectors, encode_cached(model, long, calibration=CAL), rtol=0, atol=1e-5)


def test_a_server_without_request_calibration_refuses_another_one_but_takes_its_own(tiny):
    model, spec = tiny
    engine = Engine(model, spec)
    stock, own = engine.embed_many(
        [EmbeddingRequest(("a text",), calibration="stock"), EmbeddingRequest(("a text",), calibration="16,0.5,0.5")]
    )
    assert stock.status == 400 and stock.error["error"]["code"] == "calibration_not_allowed"
    assert own.status == 200


def test_documents_batched_together_get_each_ones_late_chunking_in_fewer_passes(tiny):
    """Documents of several /v1/segments requests answered by one segments_many share forward passes (the 96-token
    budget: the four short ones in one pass, the long one alone); each answer equals the same document's late
    chunking alone (stock: posfair's LateChunking; calibrated: segments() of that request alone)."""
    from posfair.model.token_spans import join_segments
    from posfair.retrieval.late import LateChunking

    model, spec = tiny
    engine = Engine(model, spec, request_calibration=True)
    docs = [[t[:24] for t in texts_of(2 + k % 3, seed=10 + k)] for k in range(4)]  # short: 4 of them fit one pass
    docs.append([t[:80] for t in texts_of(5, seed=30)])  # long: a pass of its own
    reqs = [EmbeddingRequest(tuple(d), calibration="stock") for d in docs]
    reqs += [EmbeddingRequest(tuple(d), calibration="8,1,1,queries=all") for d in (docs[4], docs[0])]  # calibrated
    prepared = [engine.document(r) for r in reqs]
    # per calibration, the long one alone (two of it exceed 96 padded tokens), then the short ones: 2 + 2 passes
    assert 4 * max(p.tokens for p in prepared[:4]) <= 96 < 2 * prepared[4].tokens
    answers = engine.segments_many(prepared)
    assert {(a.batch_requests, a.forward_passes) for a in answers} == {(len(reqs), 4)}
    for d, ans in zip(docs, answers[:5], strict=True):
        doc, spans = join_segments(d)
        want = LateChunking(chunks=8)._compute(model, [doc], [spans])[0]
        want /= np.linalg.norm(want, axis=1, keepdims=True)  # unit length: the default (normalize)
        np.testing.assert_allclose(ans.vectors, want, rtol=0, atol=1e-5)
        assert ans.tokens == len(model.tokenizer(doc)["input_ids"])
    for req, ans in zip(reqs[5:], answers[5:], strict=True):
        alone = engine.segments(req)
        assert (alone.batch_requests, alone.forward_passes) == (1, 1)
        np.testing.assert_allclose(ans.vectors, alone.vectors, rtol=0, atol=1e-5)
    assert np.abs(answers[5].vectors - answers[4].vectors).max() > 1e-4  # calibrated


def test_a_running_serve_instance_is_joined_only_where_it_listens_and_with_no_conflicting_application():
    from posfair.serve.cluster import RunningServe, serve_conflict

    assert serve_conflict("127.0.0.1", 8000, None) is None  # no Serve there: this server starts it
    assert serve_conflict("127.0.0.1", 8000, RunningServe("127.0.0.1", 8000, {"other": "/other"})) is None
    moved = serve_conflict("0.0.0.0", 9000, RunningServe("127.0.0.1", 8000, {}))
    assert "listening at http://127.0.0.1:8000, not at http://0.0.0.0:9000" in moved and "--port 8000" in moved
    ours = serve_conflict("127.0.0.1", 8000, RunningServe("127.0.0.1", 8000, {"posfair-encoder": None}))
    assert "with a posfair server (application 'posfair-encoder')" in ours
    root = serve_conflict("127.0.0.1", 8000, RunningServe("127.0.0.1", 8000, {"shop": "/", "b": "/b"}))
    assert "application 'shop' takes the route '/'" in root


# -- issue 48: a hostile request ------------------------------------------------------------------------------------


@pytest.mark.parametrize("space", ["\t", "\n", "\u00a0", "\u3000", " ", "\r", "\v"])
@pytest.mark.parametrize("existing", [True, False])
def test_no_spelling_of_prior_makes_a_request_read_a_file(tiny, tmp_path, monkeypatch, space, existing):
    """Defect 1: 'prior\\t=/path' (any white space Calibration.parse strips around a name) was let through by the
    gateway and read by the replica (with --request-calibration: used as the prior; without: an existence oracle
    and the file's keys in the error). Now the gateway and the replica refuse it alike, opening nothing, with the
    same answer whether the file exists or not."""
    import posfair.calibration.spelling as spelling

    path = tmp_path / "secret.json"
    if existing:
        path.write_text(json.dumps({"bins": 4, "secret_key": 1}))
    opened = []
    monkeypatch.setattr(spelling, "load_prior", lambda value: opened.append(value))
    spec = f"16,1.0,1,prior{space}={path}"
    with pytest.raises(ApiError) as err:
        parse_request(body(input="x", calibration=spec), "m")
    assert err.value.status == 400 and err.value.param == "calibration"
    assert "secret_key" not in err.value.message and "exist" not in err.value.message
    model, spec_ = tiny
    for allowed in (True, False):
        (ans,) = Engine(model, spec_, request_calibration=allowed).embed_many(
            [EmbeddingRequest(("a text",), calibration=spec)]
        )
        assert ans.status == 400 and ans.error["error"]["param"] == "calibration", ans.error
        assert "secret_key" not in ans.error["error"]["message"]
    assert opened == []


def test_a_lone_surrogate_is_a_400_for_its_request_only(tiny):
    """Defect 2: "\\ud800" in input reached the batched encoder, whose exception failed every request batched with
    it (500 text/plain). Now the protocol refuses it (400, OpenAI's shape); and a request that reaches the replica
    anyway fails alone (500 in OpenAI's shape) while the requests batched with it get their vectors."""
    with pytest.raises(ApiError) as err:
        parse_request(b'{"model": "m", "input": ["ok", "\\ud800"]}', "m")
    assert err.value.status == 400 and err.value.param == "input" and "input 1" in err.value.message
    model, spec = tiny
    good = [EmbeddingRequest(tuple(texts_of(3, 40))), EmbeddingRequest(tuple(texts_of(2, 41)))]
    answers = Engine(model, spec).embed_many([good[0], EmbeddingRequest(("fine", "bad \ud800")), good[1]])
    assert answers[1].status == 500 and set(answers[1].error["error"]) == {"message", "type", "param", "code"}
    for req, ans in zip(good, (answers[0], answers[2]), strict=True):
        assert ans.status == 200
        np.testing.assert_allclose(ans.vectors, encode_cached(model, list(req.texts), calibration=CAL), atol=1e-5)


def test_a_forward_pass_that_fails_is_retried_per_request(tiny, monkeypatch):
    """Per-request isolation: when the shared forward pass raises (here: a text the model cannot take, faked), each
    request is encoded alone; only the one that fails alone gets an error, the others their own vectors. The same
    for /v1/segments documents sharing a pass."""
    model, spec = tiny
    engine = Engine(model, spec, request_calibration=True)
    real_encode, real_states = engine.pooled, engine._token_states

    def encode(texts, cal, prompt):
        if any("poison" in t for t in texts):
            raise RuntimeError("the model cannot take this text")
        return real_encode(texts, cal, prompt)

    def states(texts, cal, prompt):
        if any("poison" in t for t in texts):
            raise RuntimeError("the model cannot take this text")
        return real_states(texts, cal, prompt)

    monkeypatch.setattr(engine, "pooled", encode)
    monkeypatch.setattr(engine, "_token_states", states)
    reqs = [EmbeddingRequest(tuple(texts_of(2, s))) for s in (50, 51, 52)]
    reqs.insert(1, EmbeddingRequest(("a poison text",)))
    answers = engine.embed_many(reqs)
    assert [a.status for a in answers] == [200, 500, 200, 200]
    for i in (0, 2, 3):
        want = encode_cached(model, list(reqs[i].texts), calibration=CAL)
        np.testing.assert_allclose(answers[i].vectors, want, rtol=0, atol=1e-5)
    docs = [
        engine.document(EmbeddingRequest(d, calibration="stock"))
        for d in (("one", "two"), ("poison", "x"), ("three", "four"))
    ]
    seg = engine.segments_many(docs)
    assert [a.status for a in seg] == [200, 500, 200]
    np.testing.assert_allclose(
        seg[2].vectors, engine.segments(EmbeddingRequest(("three", "four"), calibration="stock")).vectors, atol=1e-5
    )


def test_json_too_deep_a_number_too_long_and_a_huge_basket_are_400s(tiny):
    """Defect 3: JSON nested 10,000 levels (RecursionError), 'dimensions' of 5,000 digits (ValueError) and a basket
    of 10**22 (OverflowError in the replica) were 500 text/plain; now each is a 400 in OpenAI's shape."""
    deep = b'{"model": "m", "input": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    long_number = b'{"model": "m", "input": "x", "dimensions": ' + b"9" * 5000 + b"}"
    for raw, says in ((deep, "nested too deeply"), (long_number, "number too long")):
        with pytest.raises(ApiError) as err:
            parse_request(raw, "m")
        assert err.value.status == 400 and says in err.value.message
    huge = f"{10**22},1,1"
    with pytest.raises(ApiError) as err:
        parse_request(body(input="x", calibration=huge), "m")
    assert err.value.status == 400 and err.value.param == "calibration"
    model, spec = tiny
    (ans,) = Engine(model, spec, request_calibration=True).embed_many([EmbeddingRequest(("x",), calibration=huge)])
    assert ans.status == 400 and ans.error["error"]["param"] == "calibration"


def test_dimensions_is_the_models_own_width_or_refused(tiny):
    """Defect 4: 'dimensions' was accepted and ignored (64 gave 384-wide vectors, so did 10**30). Now only the
    model's own width (here 64) is served; another is a 400 naming it, and an absurd one is refused on reading."""
    model, spec = tiny
    engine = Engine(model, spec)
    own, other = engine.embed_many(
        [EmbeddingRequest(("a text",), dimensions=64), EmbeddingRequest(("a text",), dimensions=32)]
    )
    assert own.status == 200 and own.vectors.shape == (1, 64)
    assert (
        other.status == 400
        and other.error["error"]["param"] == "dimensions"
        and "64" in other.error["error"]["message"]
    )
    assert parse_request(body(input="x", dimensions=64), "m").dimensions == 64
    for bad_value in (10**30, 0, "64", True, 6.4):
        with pytest.raises(ApiError) as err:
            parse_request(body(input="x", dimensions=bad_value), "m")
        assert err.value.param == "dimensions"
    with pytest.raises(ApiError):
        engine.document(EmbeddingRequest(("a", "b"), dimensions=32))


@pytest.mark.parametrize("text", ["\x00", "\x00\x00 \x00", "\u200b", " \t\n"])
def test_a_text_of_only_control_characters_is_empty(text):
    with pytest.raises(ApiError) as err:
        parse_request(body(input=["ok", text]), "m")
    assert err.value.param == "input" and "input 1 is empty" in err.value.message


def test_a_parts_refusal_is_said_of_the_whole_request():
    """A long request goes to the replicas in parts (texts ordered by length): a part's refusal names the text by
    its index in the request, and its count only as a lower bound."""
    from posfair.serve.deployments import _renumber

    chosen = list(range(100, 116))
    said = _renumber("2 of 16 inputs are longer than the limit (first: input 3, 99 tokens)", chosen, 300)
    assert said == "at least 2 of the request's 300 inputs are longer than the limit (one: input 103, 99 tokens)"
    assert _renumber("input 0 is empty", [7, 8], 9) == "input 7 is empty"


def test_a_huge_text_is_refused_before_it_is_tokenised():
    """A 7 MiB text was refused only after 10.6 s of tokenising; now the protocol refuses a text over
    MAX_TEXT_CHARS on its length, in no time."""
    import time

    from posfair.serve.openai_api import MAX_TEXT_CHARS

    t0 = time.perf_counter()
    with pytest.raises(ApiError) as err:
        parse_request(body(input=["ok", "word " * (7 * 2**20 // 5)]), "m")
    assert time.perf_counter() - t0 < 2.0
    assert err.value.param == "input" and f"at most {MAX_TEXT_CHARS}" in err.value.message


def test_normalize_is_a_segments_field(tiny):
    """/v1/segments vectors were means of token states (norms 1.4 to 9.9) where an OpenAI client expects unit
    vectors: unit length by default now, the plain mean with normalize false; /v1/embeddings refuses the field."""
    model, spec = tiny
    engine = Engine(model, spec)
    texts = ("The first section of a document.", "The second one, a little longer than the first.")
    unit = engine.segments(EmbeddingRequest(texts, calibration="16,0.5,0.5"))
    raw = engine.segments(EmbeddingRequest(texts, calibration="16,0.5,0.5", normalize=False))
    np.testing.assert_allclose(np.linalg.norm(unit.vectors, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(
        unit.vectors, raw.vectors / np.linalg.norm(raw.vectors, axis=1, keepdims=True), atol=1e-6
    )
    assert np.abs(np.linalg.norm(raw.vectors, axis=1) - 1).max() > 1e-3
    assert parse_request(body(input=["a", "b"], normalize=False), "m", segments=True).normalize is False
    assert parse_request(body(input=["a", "b"]), "m", segments=True).normalize is True
    with pytest.raises(ApiError) as err:
        parse_request(body(input="x", normalize=True), "m")
    assert err.value.param == "normalize"
    with pytest.raises(ApiError) as err:
        parse_request(body(input=["a"], normalize="yes"), "m", segments=True)
    assert err.value.param == "normalize"


def test_a_segments_document_is_tokenised_as_given_not_stripped(tiny):
    """/v1/segments stripped the joined document "as sentence-transformers strips" although posfair strips no text
    anywhere else: now the document is the segments joined, white space and all, and each vector is posfair's late
    chunking of that document."""
    from posfair.model.token_spans import join_segments
    from posfair.retrieval.late import LateChunking

    model, spec = tiny
    engine = Engine(model, spec, request_calibration=True)
    segs = ("  \n Leading white space is part of the text.", "The second segment ends with some.\n  ")
    doc, spans = join_segments(list(segs))
    req = EmbeddingRequest(segs, calibration="stock")
    assert engine.document(req).text == doc and doc != doc.strip()
    ans = engine.segments(req)
    want = LateChunking(chunks=8)._compute(model, [doc], [spans])[0]
    np.testing.assert_allclose(ans.vectors, want / np.linalg.norm(want, axis=1, keepdims=True), rtol=0, atol=1e-5)
    assert ans.tokens == len(model.tokenizer(doc)["input_ids"])


def test_a_segments_document_shorter_than_one_basket_is_counted_as_stock(tiny):
    """A document the calibration leaves stock (shorter than one basket of 16 tokens) is said in the answer (the
    gateway's X-Posfair-Stock-Short header, as /v1/embeddings says it), with the stock vectors it gets."""
    model, spec = tiny
    engine = Engine(model, spec, request_calibration=True)
    short = ("Two words.", "Three more.")
    long = ("A document long enough to hold more than one basket of sixteen tokens,", "in two segments of it.")
    cal = engine.segments(EmbeddingRequest(short))  # the server's calibration: B=16
    stock = engine.segments(EmbeddingRequest(short, calibration="stock"))
    assert (cal.short, stock.short) == (1, 0)
    np.testing.assert_allclose(cal.vectors, stock.vectors, rtol=0, atol=1e-6)
    assert 16 < engine.document(EmbeddingRequest(long)).tokens <= LIMIT
    assert engine.segments(EmbeddingRequest(long)).short == 0


def test_a_clients_long_requests_take_turns_so_another_clients_finishes_first():
    """Per-client fair share: client A sends three long requests and client B one, all at once, to a replica that
    answers one part at a time in arrival order (4 parts each).  A's requests hold one turn between them, so B's
    parts alternate with A's and B is answered after about 8 parts -- not after 16, at the back of a queue of four
    requests taking turns part by part as equals, as without per-client turns."""
    import asyncio

    from posfair.serve.sharing import FairShare

    async def run() -> tuple[dict, dict]:
        share, replica = FairShare(parts=1), asyncio.Lock()
        done, busy, most = {}, {"A": 0, "B": 0}, {"A": 0, "B": 0}
        clock = [0]

        async def part(client: str) -> None:
            async with share.turn(client):
                busy[client] += 1
                most[client] = max(most[client], busy[client])
                async with replica:  # the replica: one part at a time, first come first served
                    await asyncio.sleep(0.001)
                    clock[0] += 1
                busy[client] -= 1

        async def request(client: str, name: str) -> None:
            for _ in range(4):
                await part(client)
            done[name] = clock[0]

        await asyncio.gather(*(request("A", f"A{i}") for i in range(3)), request("B", "B"))
        assert share.clients() == 0  # nothing kept of a client once its requests are answered
        return done, most

    done, most = asyncio.run(run())
    assert most == {"A": 1, "B": 1}, most  # one part in flight per client
    assert done["B"] <= 9 and max(done[f"A{i}"] for i in range(3)) == 16, done


def test_serve_uses_no_private_ray_api():
    """Issue 48: the server found a running Serve instance through ray.serve.context._get_global_client, a private
    name; no serve module imports or reads a private name of Ray (a leading underscore, or a _private module)."""
    import ast
    from pathlib import Path

    import posfair.serve.runner as runner

    # the one exception, said where it is used: Serve binds each replica's inter-deployment gRPC server to [::]
    # with no option (deployments._replica_grpc_on_loopback hands it the loopback)
    allowed = {("deployments.py", "_private")}
    found = []
    for path in sorted(Path(runner.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
                names = [*node.module.split("."), *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [p for a in node.names if a.name.split(".")[0] == "ray" for p in a.name.split(".")]
            elif isinstance(node, ast.Attribute) and ast.unparse(node.value).split(".")[0] in ("ray", "serve"):
                names = [node.attr]
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n.startswith("_")]
    found = [f for f in found if (f.split(":")[0], f.rsplit(": ", 1)[1]) not in allowed]
    assert not found, found
