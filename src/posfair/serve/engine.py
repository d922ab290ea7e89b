"""What a ``posfair serve`` replica computes, without Ray or HTTP: checked requests in, vectors out.

* :meth:`Engine.embed_many` answers many ``/v1/embeddings`` requests at once (the requests Ray Serve
  batched together): their texts are pooled per (calibration, prompt), cut into forward passes by
  :func:`posfair.encoding.encode_in_batches` -- sorted by token length, each pass within the
  padded-token budget, exactly as ``posfair embed`` batches a shard -- and handed back per request.
  A request that cannot be served (a text over the token limit without ``--truncate``, an unknown
  prompt, a calibration the server does not allow) gets its own error; the others are unaffected.
* :meth:`Engine.segments_many` answers many ``/v1/segments`` requests at once: each one document given as
  its segments, joined by :func:`posfair.model.token_spans.join_segments` and tokenised by :meth:`Engine.document`
  (before it joins a batch: its token count is its size in Ray Serve's batch); the documents of a
  batch are pooled per (calibration, prompt) and cut into forward passes by
  :func:`posfair.encoding.batching.length_aware_batches` (sorted by length, each pass within the
  padded-token budget); each segment's vector is the mean of its document's final token states over its
  tokens (:func:`posfair.model.token_spans.contextualised_segments`), as posfair's late chunking pools them.
  Every answer says how many requests its batch held and how many forward passes it took.

The vectors are ``encode``'s (float32, as the model returns them): the same texts, model, calibration
and prompt give ``posfair encode``'s vectors, to summation order whatever the batching.

A replica calls its engine from several threads at once (its request queues each hand their batch to a thread of
its own).  Every use of the model and of its tokenizer -- a request's token counts, a document's tokenisation, a
forward pass -- holds the engine's one lock: a Hugging Face fast tokenizer keeps its truncation and padding on the
shared tokenizer object, set by each call just before it tokenises, so two calls that interleave tokenise with each
other's settings (a forward pass tokenised unpadded fails; a count made truncated lets a text over the limit in).

A request whose computation fails (not a refused one) is answered 500 and logged at WARNING on the
``posfair.serve`` logger with its exception's type and traceback, never its message (it may quote a text).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from posfair.calibration import STOCK, Calibration
from posfair.calibration.coverage import calibration_coverage
from posfair.distributed.spec import EmbedSpec
from posfair.encoding.batching import length_aware_batches
from posfair.encoding.model_inputs import PromptedTokenizer
from posfair.encoding.passes import encode_in_batches, token_outputs
from posfair.model import compat
from posfair.model.token_spans import contextualised_segments, join_segments, token_segment_index
from posfair.serve.openai_api import ApiError, EmbeddingRequest, bad, request_calibration

__all__ = ["Answer", "Document", "Engine"]

logger = logging.getLogger("posfair.serve")
#: forward passes failed in a row, whatever the request, that make a replica unhealthy (Serve's check_health)
FAILING = 8


@dataclasses.dataclass
class Answer:
    """A replica's answer to one request: vectors and token counts, or an error (status, OpenAI body)."""

    vectors: np.ndarray | None = None
    tokens: int = 0
    truncated: int = 0
    error: dict | None = None
    status: int = 200
    short: int = 0  # texts a calibration left stock (shorter than one basket: encode's CalibrationFallbackWarning)
    batch_requests: int = 0  # /v1/segments: the requests answered by the same batch (this one included)
    forward_passes: int = 0  # /v1/segments: the forward passes that batch took

    @classmethod
    def refused(cls, err: ApiError) -> Answer:
        return cls(error=err.body(), status=err.status)


@dataclasses.dataclass(frozen=True)
class _Prepared:
    texts: tuple[str, ...]
    cal: Any  # Calibration or STOCK
    prompt: str | None  # None: the model's default prompt
    tokens: np.ndarray  # per text, as encoded (prompt and special tokens included, after truncation)
    truncated: int
    short: int = 0  # texts the calibration leaves stock


@dataclasses.dataclass(frozen=True)
class Document:
    """A ``/v1/segments`` request checked and tokenised (:meth:`Engine.document`): what its forward pass needs."""

    text: str  # the joined segments, as given
    cal: Any  # Calibration or STOCK
    prompt: str | None  # None: the model's default prompt
    ids: tuple[int, ...]  # its tokens in the forward pass (prompt and special tokens included, after truncation)
    segment_of: np.ndarray  # each token's segment, or -1
    n_segments: int
    truncated: int  # 1 when the document was cut at the token limit
    size: int  # its share of a batch's token budget: its tokens, at most the whole budget
    normalize: bool = True  # each segment vector divided by its length
    short: int = 0  # 1 when the calibration leaves the document stock (shorter than one basket)

    @property
    def tokens(self) -> int:
        return len(self.ids)


def _failed(exc: BaseException) -> Answer:
    """The answer to a request whose own computation failed, logged (:func:`_log_failure`)."""
    _log_failure(exc, "a request")
    return Answer.refused(ApiError(500, "the model could not encode this request", "server_error"))


def _log_failure(exc: BaseException, what: str) -> None:
    """``exc`` at WARNING: its type on the first line, then its traceback (the exceptions it was raised from or
    while handling first, as Python prints them), without any exception's message: a message may quote a text."""
    logger.warning("%s failed in the model replica: %s\n%s", what, _type_name(exc), _traceback(exc))


def _type_name(exc: BaseException) -> str:
    kind = type(exc)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _traceback(exc: BaseException) -> str:
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    parts = [
        "Traceback (most recent call last):\n"
        + "".join(traceback.format_tb(e.__traceback__))
        + f"{_type_name(e)} (its message is not logged: it may quote a request's text)"
        for e in reversed(chain)
    ]
    return "\n\nwhich led to:\n\n".join(parts)


def _isolated(members: list[int], compute: Callable[[list[int]], dict[int, Answer]]) -> dict[int, Answer]:
    """``compute(members)``; if it fails, each member alone, so a failure is answered only to the request that
    causes it (its own 500), never to the others that shared its forward pass."""
    try:
        return compute(members)
    except Exception as exc:  # noqa: BLE001 -- retried one by one: the failure is found out, not spread
        if len(members) == 1:
            return {members[0]: _failed(exc)}
    out: dict[int, Answer] = {}
    for i in members:
        out.update(_isolated([i], compute))
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _cal_key(cal: Any) -> str:
    return "stock" if cal is STOCK else json.dumps(cal.to_dict(), sort_keys=True)


class Engine:
    """A loaded model answering checked requests (see the module's description).

    ``spec`` is what the replica loaded the model from; its ``calibration`` is the server's
    (None: stock) and its ``max_batch_tokens`` the padded-token budget of a forward pass.  With
    ``request_calibration`` a request may ask for ``stock``, ``default`` or another spec.
    """

    def __init__(self, model: Any, spec: EmbedSpec, *, truncate: bool = False, request_calibration: bool = False):
        self.model, self.spec = model, spec
        self.truncate, self.request_calibration = truncate, request_calibration
        self.calibration = spec.calibration_obj
        self.limit = int(model.max_seq_length)
        self.width = compat.embedding_dimension(model)
        # one use of the model or its tokenizer at a time, whatever the thread (see the module's description): a
        # forward pass (the model's calibration override is per block), a request's checks and token counts, a
        # document's tokenisation -- the tokenizer's truncation and padding are set on it by each call
        self._lock = threading.Lock()
        self._failures = 0  # forward passes failed in a row (any request): check_health fails past FAILING

    def failing(self) -> bool:
        """Whether the last :data:`FAILING` forward passes all failed (the replica is broken, not a request)."""
        return self._failures >= FAILING

    def _counted(self, run: Callable[[], Any]) -> Any:
        try:
            out = run()
        except Exception:
            self._failures += 1
            raise
        self._failures = 0
        return out

    # -- request settings -------------------------------------------------------------------------
    def calibration_for(self, text: str | None) -> Any:
        """The calibration a request's ``calibration`` field asks for (None: the server's); 400 when refused.  The
        field is checked first as the gateway checks it (:func:`posfair.serve.openai_api.request_calibration`: no
        ``prior=``, however spelt), so no request makes a replica open a file."""
        if text is None:
            return self.calibration
        text = request_calibration(text)
        try:
            cal = STOCK if text.lower() == "stock" else Calibration.parse(text)
        except (ValueError, TypeError, ArithmeticError) as exc:  # OverflowError: a number too large for its field
            raise bad(f"'calibration': {_one_line(exc)}", "calibration") from None
        if cal is not STOCK and cal.prior is not None:  # unreachable past request_calibration; never served
            raise bad("'calibration' cannot name a prior file (prior=FILE): a request reads no file", "calibration")
        if cal != self.calibration and not self.request_calibration:
            raise bad(
                f"this server encodes with {self.label(self.calibration)} only; it was not started with "
                "--request-calibration, so a request cannot choose another calibration",
                "calibration",
                "calibration_not_allowed",
            )
        if cal is not STOCK:
            try:
                self.model.transformer_module.resolve(cal)
            except (ValueError, TypeError, ArithmeticError) as exc:
                raise bad(f"'calibration' does not fit the model: {_one_line(exc)}", "calibration") from None
        return cal

    def check_dimensions(self, dimensions: int | None) -> None:
        """A request's ``dimensions``: absent, or the model's own width (posfair does not shorten vectors); 400."""
        if dimensions is not None and dimensions != self.width:
            raise bad(
                f"'dimensions' must be the model's own width {self.width} (posfair does not shorten vectors); "
                f"got {dimensions}",
                "dimensions",
            )

    @staticmethod
    def label(cal: Any) -> str:
        return "stock" if cal is STOCK else f"calibration {cal.spec()}"

    def prompt_for(self, name: str | None) -> str | None:
        """The prompt text of ``prompt_name`` (None: the model's default prompt); 400 for an unknown name."""
        if name is None:
            return None
        prompts = dict(getattr(self.model, "prompts", None) or {})
        if name not in prompts:
            known = ", ".join(sorted(prompts)) or "none"
            raise bad(f"'prompt_name' {name!r} is not one of the model's prompts (its prompts: {known})", "prompt_name")
        return prompts[name]

    def _full_prompt(self, prompt: str | None) -> str:
        return compat.resolve_prompt(self.model, prompt, None) or ""

    def prepare(self, req: EmbeddingRequest) -> _Prepared:
        """A request's settings and token counts checked against the model; :class:`ApiError` (400) if refused."""
        with self._lock:  # the shared model and tokenizer: never beside another thread's use of them
            return self._prepare(req)

    def _prepare(self, req: EmbeddingRequest) -> _Prepared:
        self.check_dimensions(req.dimensions)
        cal = self.calibration_for(req.calibration)
        prompt = self.prompt_for(req.prompt_name)
        full = self._full_prompt(prompt)
        raw = self.model.token_lengths([full + t for t in req.texts])
        over = np.flatnonzero(raw > self.limit)
        if len(over) and not self.truncate:
            raise bad(
                f"{len(over)} of {len(raw)} inputs are longer than the model's token limit {self.limit} "
                f"(first: input {int(over[0])}, {int(raw[over[0]])} tokens); shorten them, or start the server "
                "with --truncate",
                "input",
                "context_length_exceeded",
            )
        tokens = np.minimum(raw, self.limit)
        short = (
            0 if cal is STOCK else calibration_coverage(self.model.transformer_module.resolve(cal), tokens).fallen_back
        )
        return _Prepared(tuple(req.texts), cal, prompt, tokens, len(over), int(short))

    # -- /v1/embeddings ---------------------------------------------------------------------------
    def embed_many(self, requests: Sequence[EmbeddingRequest]) -> list[Answer]:
        """One answer per request; the texts of all the accepted ones share forward passes.  A request that fails
        its checks gets its own 400; a forward pass that fails is retried request by request, so only a request
        that fails alone gets an error (500) -- one request never changes another's answer."""
        answers: list[Answer | None] = [None] * len(requests)
        prepared: dict[int, _Prepared] = {}
        for i, req in enumerate(requests):
            try:
                prepared[i] = self.prepare(req)
            except ApiError as err:
                answers[i] = Answer.refused(err)
            except Exception as exc:  # noqa: BLE001 -- this request's own failure (its answer), never the batch's
                answers[i] = _failed(exc)
        groups: dict[tuple[str, str | None], list[int]] = {}
        for i, p in prepared.items():
            groups.setdefault((_cal_key(p.cal), p.prompt), []).append(i)
        for members in groups.values():
            for i, answer in _isolated(members, lambda ms: self._encode_members(ms, prepared)).items():
                answers[i] = answer
        return answers  # type: ignore[return-value]

    def _encode_members(self, members: list[int], prepared: dict[int, _Prepared]) -> dict[int, Answer]:
        first = prepared[members[0]]
        texts = [t for i in members for t in prepared[i].texts]
        vectors = self.pooled(texts, first.cal, first.prompt)
        out, start = {}, 0
        for i in members:
            p = prepared[i]
            out[i] = Answer(vectors[start : start + len(p.texts)], int(p.tokens.sum()), p.truncated, short=p.short)
            start += len(p.texts)
        return out

    def pooled(self, texts: list[str], cal: Any, prompt: str | None) -> np.ndarray:
        """``texts`` encoded as ``posfair embed`` encodes a shard: length-sorted, token-budget batches (the token
        budget alone bounds a batch)."""
        budget = self.spec.max_batch_tokens
        with self._lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # truncation is reported to the client (a header), not logged
            vectors, _counts = self._counted(
                lambda: encode_in_batches(
                    self.model, texts, cal, prompt=prompt, max_batch_tokens=budget, batch_size=budget
                )
            )
        return vectors

    # -- /v1/segments -----------------------------------------------------------------------------
    def segments(self, req: EmbeddingRequest) -> Answer:
        """Late chunking of one document given as its segments (a batch of one; see the module's description)."""
        try:
            doc = self.document(req)
        except ApiError as err:
            return Answer.refused(err)
        return self.segments_many([doc])[0]

    def document(self, req: EmbeddingRequest) -> Document:
        """A ``/v1/segments`` request's document, joined, checked and tokenised; :class:`ApiError` (400) if refused.
        Any other exception is logged (type and traceback) before it is raised."""
        try:
            with self._lock:  # the shared model and tokenizer: never beside another thread's use of them
                return self._document(req)
        except ApiError:
            raise
        except Exception as exc:
            _log_failure(exc, "a /v1/segments request")
            raise

    def _document(self, req: EmbeddingRequest) -> Document:
        self.check_dimensions(req.dimensions)
        cal = self.calibration_for(req.calibration)
        prompt = self.prompt_for(req.prompt_name)
        doc, spans = join_segments(list(req.texts))  # tokenised as given (posfair strips no text anywhere)
        full = self._full_prompt(prompt)
        tok = PromptedTokenizer(self.model.tokenizer, full) if full else self.model.tokenizer
        n = len(tok(doc, add_special_tokens=True, truncation=False)["input_ids"])
        if n > self.limit and not self.truncate:
            raise bad(
                f"the document has {n} tokens, over the model's token limit {self.limit}; shorten it, or start the "
                "server with --truncate (segments beyond the limit are then refused)",
                "input",
                "context_length_exceeded",
            )
        enc = tok(
            [doc],
            add_special_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            truncation=True,
            max_length=self.limit,
        )
        idx = token_segment_index(enc["offset_mapping"][0], spans, enc["special_tokens_mask"][0])
        empty = [k for k in range(len(spans)) if not (idx == k).any()]
        if empty:
            where = "beyond the token limit" if n > self.limit else "of no token of its own"
            raise bad(
                f"{len(empty)} of {len(spans)} segments consist {where} (first: segment {empty[0]}): "
                "they have no token state to pool",
                "input",
            )
        ids = tuple(int(i) for i in enc["input_ids"][0])
        resolved = None if cal is STOCK else self.model.transformer_module.resolve(cal)
        short = 0 if resolved is None else calibration_coverage(resolved, np.array([len(ids)])).fallen_back
        return Document(
            doc,
            cal,
            prompt,
            ids,
            idx,
            len(spans),
            int(n > self.limit),
            min(len(ids), self.spec.max_batch_tokens),
            req.normalize,
            int(short),
        )

    def segments_many(self, docs: Sequence[Document]) -> list[Answer]:
        """One answer per document; documents of the same calibration and prompt share forward passes (a pass that
        fails is retried document by document, as :meth:`embed_many` retries)."""
        answers: list[Answer | None] = [None] * len(docs)
        groups: dict[tuple[str, str | None], list[int]] = {}
        for i, d in enumerate(docs):
            groups.setdefault((_cal_key(d.cal), d.prompt), []).append(i)
        passes = [0]

        def one_pass(chosen: list[int]) -> dict[int, Answer]:
            first = docs[chosen[0]]
            outs = self._token_states([docs[i].text for i in chosen], first.cal, first.prompt)
            passes[0] += 1
            return {i: self._pooled(docs[i], out) for i, out in zip(chosen, outs, strict=True)}

        for members in groups.values():
            for batch in length_aware_batches([docs[i].tokens for i in members], self.spec.max_batch_tokens):
                for i, answer in _isolated([members[j] for j in batch], one_pass).items():
                    answers[i] = answer
        for a in answers:
            a.batch_requests, a.forward_passes = len(docs), passes[0]  # type: ignore[union-attr]
        return answers  # type: ignore[return-value]

    def _token_states(self, texts: list[str], cal: Any, prompt: str | None) -> list[dict]:
        """The model's outputs for ``texts`` in one forward pass (token states, attention mask, input ids per text)."""
        with self._lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # truncation is reported to the client (a header), not logged
            return self._counted(lambda: token_outputs(self.model, texts, cal, prompt=prompt, batch_size=len(texts)))

    @staticmethod
    def _pooled(doc: Document, out: dict) -> Answer:
        """A document's segment vectors: the mean of its final token states over each segment's tokens."""
        valid = out["attention_mask"].bool().cpu().numpy()
        ids = out["input_ids"].cpu().numpy()[valid]
        if tuple(int(i) for i in ids) != doc.ids:
            logger.warning(
                "a /v1/segments request failed in the model replica: its forward pass had %d tokens, its document "
                "was tokenised to %d",
                len(ids),
                len(doc.ids),
            )
            return Answer.refused(
                ApiError(500, "the model tokenised the document differently from its tokenizer", "server_error")
            )
        states = out["token_embeddings"].float().cpu().numpy()[valid]
        vectors = contextualised_segments(states, doc.segment_of, doc.n_segments).astype(np.float32)
        if doc.normalize:  # as encode and an OpenAI client expect: unit vectors
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        return Answer(vectors, doc.tokens, doc.truncated, short=doc.short)
