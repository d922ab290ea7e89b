"""A replica's engine called from several threads at once, as ``posfair serve``'s replica calls it.

Each replica answers its ``/v1/embeddings`` requests from two ``@serve.batch`` queues (short requests, and the
parts of long ones) and its ``/v1/segments`` requests from a third step, each in a thread of its own
(``asyncio.to_thread``), all with the one model and its one fast tokenizer.  A Hugging Face fast tokenizer keeps
its truncation and padding on the shared Rust object: every call sets them, then tokenises, so a call of one
thread that sets its settings between another thread's settings and its tokenisation changes the other's result.
A 13-minute soak got seven 500s ("Unable to create tensor ... activate truncation and/or padding": a padded pass
tokenised unpadded by a token count in another thread).  The interleaving is rare under load, so these tests make
it happen every time: a wrapper around the Rust tokenizer holds one thread's call after its settings until the
other thread's call has set its own (or, where the engine keeps the other out, for a while), then lets the other
one go on only after it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest

from posfair.calibration import STOCK
from posfair.distributed.spec import EmbedSpec
from posfair.encoding import encode_cached
from posfair.serve.engine import Engine
from posfair.serve.openai_api import ApiError, EmbeddingRequest

#: how long the held call waits for the other thread's call, which an engine that serialises its tokenizer keeps
#: out until the held one is done (the wait bounds the test; nothing is timed)
HOLD_S = 1.5
WORDS = "posfair measures and repairs positional bias in text embedding models of many kinds".split()


def texts_of(n: int, seed: int, longest: int = 60) -> tuple[str, ...]:
    rng = np.random.default_rng(seed)
    return tuple(" ".join(rng.choice(WORDS, size=int(rng.integers(2, longest)))) for _ in range(n))


class Interleaving:
    """Stands for a fast tokenizer's Rust object.  The thread named ``first`` is held in its first tokenisation
    whose settings are ``first_padded`` (padding on or off) -- after its settings were made, before it tokenises --
    until the thread named ``second`` reaches a tokenisation whose settings are ``second_padded``; that one goes on
    once the held one is done.  On an engine that lets the two interleave, the held call tokenises with the
    other's settings."""

    def __init__(self, inner: Any, first_padded: bool, second_padded: bool):
        self.__dict__.update(inner=inner, first_padded=first_padded, second_padded=second_padded)
        self.__dict__.update(held=threading.Event(), arrived=threading.Event(), done=threading.Event())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.inner, name, value)

    def encode_batch(self, *args: Any, **kwargs: Any) -> Any:
        padded, who = self.inner.padding is not None, threading.current_thread().name
        if who == "first" and padded == self.first_padded and not self.held.is_set():
            self.held.set()
            self.arrived.wait(HOLD_S)  # the other thread's settings are made now, unless it is kept out
            try:
                return self.inner.encode_batch(*args, **kwargs)
            finally:
                self.done.set()
        if who == "second" and padded == self.second_padded and self.held.is_set() and not self.arrived.is_set():
            self.arrived.set()
            self.done.wait(30)
        return self.inner.encode_batch(*args, **kwargs)


@pytest.fixture(scope="module")
def bundled(minilm):
    return minilm, EmbedSpec(model="bundled", max_batch_tokens=4096)


def run_interleaved(model: Any, first, second, *, first_padded: bool, second_padded: bool, monkeypatch) -> list:
    """``first()`` and ``second()`` in two threads, interleaved in the tokenizer as :class:`Interleaving` says;
    their results (or exceptions) in that order."""
    tok = model.tokenizer
    gate = Interleaving(tok._tokenizer, first_padded, second_padded)
    monkeypatch.setattr(tok, "_tokenizer", gate)
    out: dict[str, Any] = {}

    def call(name: str, fn) -> None:
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 -- handed to the test
            out[name] = exc

    threads = [
        threading.Thread(target=call, args=(name, fn), name=name) for name, fn in (("first", first), ("second", second))
    ]
    threads[0].start()
    assert gate.held.wait(60), "the first thread never tokenised as the test expects"
    threads[1].start()
    for t in threads:
        t.join(120)
        assert not t.is_alive()
    monkeypatch.setattr(tok, "_tokenizer", gate.inner)
    return [out["first"], out["second"]]


def assert_encoded(model: Any, req: EmbeddingRequest, answer) -> None:
    assert answer.status == 200, answer.error
    want = encode_cached(model, list(req.texts), calibration=STOCK)
    np.testing.assert_allclose(answer.vectors, want, rtol=0, atol=1e-5)
    assert answer.tokens == sum(len(ids) for ids in model.tokenizer(list(req.texts))["input_ids"])


def test_a_padded_pass_is_not_unpadded_by_another_threads_token_count(bundled, monkeypatch):
    """The soak's 500: a request's forward pass (padded) tokenised after another thread's token count (unpadded)
    had turned padding off, so its texts came out of different lengths and the tensor could not be made."""
    model, spec = bundled
    engine = Engine(model, spec)
    a, b = EmbeddingRequest(texts_of(40, 1)), EmbeddingRequest(texts_of(12, 2))
    first, second = run_interleaved(
        model,
        lambda: engine.embed_many([a])[0],
        lambda: engine.embed_many([b])[0],
        first_padded=True,
        second_padded=False,
        monkeypatch=monkeypatch,
    )
    assert_encoded(model, a, first)
    assert_encoded(model, b, second)


def test_a_token_count_is_not_truncated_by_another_threads_forward_pass(bundled, monkeypatch):
    """The other way round: a /v1/segments document over the token limit, counted while another thread's forward
    pass had turned truncation on (at the limit), was counted at the limit, so a server started without --truncate
    did not refuse it as too long: here it refused it for a wrong reason (segments of no token of their own); a
    document whose last segment begins within the limit was taken with its end silently cut off."""
    model, spec = bundled
    engine = Engine(model, spec)
    doc = EmbeddingRequest(texts_of(12, 3, longest=80))  # ~500 tokens, over the bundled model's 256
    assert sum(model.token_lengths(list(doc.texts))) > engine.limit
    b = EmbeddingRequest(texts_of(20, 4))

    def segments():
        try:
            return engine.document(doc)
        except ApiError as err:
            return err

    first, second = run_interleaved(
        model,
        segments,
        lambda: engine.embed_many([b])[0],
        first_padded=False,
        second_padded=True,
        monkeypatch=monkeypatch,
    )
    assert isinstance(first, ApiError) and first.status == 400 and first.code == "context_length_exceeded", first
    assert_encoded(model, b, second)


def test_a_padded_pass_is_not_unpadded_by_a_segments_document_being_tokenised(bundled, monkeypatch):
    """/v1/segments tokenised its document outside the engine's lock as well: the same 500 for the /v1/embeddings
    request whose pass it interleaved with; and the document's late chunking is its own alone."""
    model, spec = bundled
    engine = Engine(model, spec)
    a = EmbeddingRequest(texts_of(30, 5))
    doc = EmbeddingRequest(texts_of(3, 6, longest=20))
    alone = engine.segments(doc)
    first, second = run_interleaved(
        model,
        lambda: engine.embed_many([a])[0],
        lambda: engine.segments_many([engine.document(doc)])[0],
        first_padded=True,
        second_padded=False,
        monkeypatch=monkeypatch,
    )
    assert_encoded(model, a, first)
    assert second.status == 200, second.error
    np.testing.assert_allclose(second.vectors, alone.vectors, rtol=0, atol=1e-5)


def test_a_failed_request_is_logged_with_its_traceback_but_not_its_texts(bundled, monkeypatch, caplog):
    """A 500 said only the exception's type in the replica's log ("ValueError"): now a WARNING with the type and
    the traceback (where it was raised), for /v1/embeddings and /v1/segments alike, and still no request's text
    (the exception's message may quote one, so it is left out)."""
    import posfair.serve.engine as engine_module

    model, spec = bundled
    engine = Engine(model, spec)
    secret = "confidential-sentence-4711"

    def fails_here(*args, **kwargs):
        raise RuntimeError(f"the model cannot take {secret}")

    monkeypatch.setattr(engine, "pooled", fails_here)
    monkeypatch.setattr(engine_module, "token_segment_index", fails_here)
    with caplog.at_level(logging.WARNING, logger="posfair.serve"):
        (ans,) = engine.embed_many([EmbeddingRequest((secret,))])
        with pytest.raises(RuntimeError):
            engine.document(EmbeddingRequest((secret, "another segment")))
    assert ans.status == 500
    records = [r for r in caplog.records if r.name == "posfair.serve"]
    assert len(records) == 2, [r.getMessage() for r in records]
    for record in records:
        said = record.getMessage()
        assert record.levelno == logging.WARNING and "RuntimeError" in said.splitlines()[0]
        assert "Traceback" in said and "fails_here" in said and "test_engine_threads.py" in said, said
        assert secret not in said
