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
        model=str(path), pooling=pooling, max_seq_length=LIMIT, calibration=CAL.to_dict(), max_tokens=96
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
    from posfair.retrieval.late import LateChunking
    from posfair.spans import join_segments

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
        np.testing.assert_allclose(ans.vectors, want, rtol=0, atol=1e-5)
        assert ans.tokens == len(model.tokenizer(doc)["input_ids"])
    for req, ans in zip(reqs[5:], answers[5:], strict=True):
        alone = engine.segments(req)
        assert (alone.batch_requests, alone.forward_passes) == (1, 1)
        np.testing.assert_allclose(ans.vectors, alone.vectors, rtol=0, atol=1e-5)
    assert np.abs(answers[5].vectors - answers[4].vectors).max() > 1e-4  # calibrated


def test_a_running_serve_instance_is_joined_only_where_it_listens_and_with_no_conflicting_application():
    from posfair.serve.runner import RunningServe, serve_conflict

    assert serve_conflict("127.0.0.1", 8000, None) is None  # no Serve there: this server starts it
    assert serve_conflict("127.0.0.1", 8000, RunningServe("127.0.0.1", 8000, {"other": "/other"})) is None
    moved = serve_conflict("0.0.0.0", 9000, RunningServe("127.0.0.1", 8000, {}))
    assert "listening at http://127.0.0.1:8000, not at http://0.0.0.0:9000" in moved and "--port 8000" in moved
    ours = serve_conflict("127.0.0.1", 8000, RunningServe("127.0.0.1", 8000, {"posfair-encoder": None}))
    assert "with a posfair server (application 'posfair-encoder')" in ours
    root = serve_conflict("127.0.0.1", 8000, RunningServe("127.0.0.1", 8000, {"shop": "/", "b": "/b"}))
    assert "application 'shop' takes the route '/'" in root
