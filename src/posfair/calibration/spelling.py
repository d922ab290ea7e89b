"""How each calibration setting is written and read back: one table (:data:`_FORMS`), a row per setting beyond
``B,layers,alpha``, from which :meth:`~posfair.calibration.params.Calibration.label` (short, for tables),
:meth:`~posfair.calibration.params.Calibration.describe` (in words), :meth:`~posfair.calibration.params.Calibration.spec`
(the command line) and :meth:`~posfair.calibration.params.Calibration.parse` (which reads ``spec`` back exactly) are
written; and :func:`parse_layers`, the command-line form of ``layers``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posfair.calibration.positional_prior import load_prior
from posfair.calibration.setting_values import POOLING_DECIDES, SCHEDULES, TRAILING, Share

# -- the string forms: one row per setting beyond B,layers,alpha -------------------------------------------


def layers_label(layers: int | float | tuple[int, ...]) -> str:
    """``layers`` as a label writes it after its ``L``, each kind spelt so that none reads as another: ``last1``
    (the last layer), ``last4`` (the last 4), ``0.5`` (that share of the layers, counted from the last), ``all``
    (every layer: the share 1.0), ``3+4+5`` / ``5+`` (those 0-based indices).  Never a bare whole number: on the
    command line ``1`` is the last layer and ``1.0`` every layer, one character apart."""
    if isinstance(layers, tuple):
        return "+".join(str(i) for i in layers) + ("+" if len(layers) == 1 else "")
    if isinstance(layers, float):
        return "all" if layers >= 1 else f"{layers:g}"
    return f"last{layers}"


def _layers_text(layers: int | float | tuple[int, ...], exact: bool = False) -> str:
    """``layers`` as written in a label (``6``, ``0.5``, ``3+4+5``) or, ``exact``, on the command line, where one
    explicit index is ``5+`` (``5`` would be the last 5 layers)."""
    if not isinstance(layers, tuple):
        return str(layers)
    return "+".join(str(i) for i in layers) + ("+" if exact and len(layers) == 1 else "")


def _number(x: float) -> str:
    """A number on the command line: ``%g`` when that reads back exactly, else every digit (``repr``)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _mass_words(weight: Share) -> str:
    if weight == "original":
        return "keeps its original mass"
    if weight == "equal":
        return "gets a basket's equal share"
    return f"gets {weight:g} of the row"


def _read_share(value: str, where: str) -> Share:
    if value in ("original", "equal"):
        return value
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where} must be 'original', 'equal' or a float in [0, 1); got {value!r}") from None


def _read_rho(value: str, where: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where} must be a number in [0, 1]; got {value!r}") from None


def _read_bool(value: str, where: str) -> bool:
    if value not in ("true", "false"):
        raise ValueError(f"{where} must be true or false; got {value!r}")
    return value == "true"


def _read_one_of(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    def read(value: str, where: str) -> str:
        if value not in allowed:
            raise ValueError(f"{where} must be {', '.join(allowed[:-1])} or {allowed[-1]}; got {value!r}")
        return value

    return read


def _heads_text(value: tuple[tuple[int, tuple[float, ...]], ...]) -> str:
    """Per-head strengths on the command line: ``LAYER:S/S/...`` per layer, joined by ``+`` (``4:0.5/0/1+5:1/1/1``),
    every number exact (:func:`_number`)."""
    return "+".join(f"{i}:" + "/".join(_number(v) for v in values) for i, values in value)


def _read_heads(value: str, where: str) -> dict[int, tuple[float, ...]]:
    out: dict[int, tuple[float, ...]] = {}
    try:
        for part in value.split("+"):
            layer, sep, values = part.partition(":")
            if not sep or int(layer) in out:
                raise ValueError
            out[int(layer)] = tuple(float(v) for v in values.split("/"))
    except ValueError:
        raise ValueError(
            f"{where} must be LAYER:S/S/...[+LAYER:S/S/...] (per-head strengths of each layer); got {value!r}"
        ) from None
    return out


def _heads_label(value: tuple[tuple[int, tuple[float, ...]], ...]) -> str:
    """``heads<layers>x<heads>.<digest>``: the per-head strengths by their shape and a digest of their values."""
    digest = hashlib.sha256(json.dumps([[i, list(v)] for i, v in value]).encode()).hexdigest()[:8]
    return f"heads{len(value)}x{len(value[0][1])}.{digest}"


def _read_temperature(value: str, where: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{where} must be a number > 0; got {value!r}") from None


@dataclass(frozen=True)
class _Form:
    """How one setting beyond ``B,layers,alpha`` is written in each string form of :class:`Calibration`."""

    field: str  # the Calibration field
    default: Any  # no form writes the field at this value
    label: Callable[[Any], str]  # its token in label() (``B128-L0.5-a0.5-<token>``)
    words: Callable[[Any], str]  # its phrase in describe()
    name: str  # NAME in spec()'s and parse()'s NAME=VALUE
    hint: str  # VALUE in error messages (``trailing=POLICY``)
    read: Callable[[str, str], Any]  # parse()'s reading of VALUE (the second argument names it in errors)
    text: Callable[[Any], str] = str  # spec()'s VALUE
    keyed_at_default: bool = True  # to_dict (hence key) writes it at its default (the fields older than keys)

    def at_default(self, value: Any) -> bool:
        return value is self.default or (isinstance(value, str) and value == self.default)


_WORDS_QUERIES = {"all": "every query row", "pool": "the pooling row only"}
_WORDS_TRAILING = {
    "merge": "a last basket shorter than B merged into the one before",
    "weighted": "each basket's mass in proportion to its size",
}

#: every setting beyond ``B,layers,alpha``, in the order label() and describe() write them
_FORMS: tuple[_Form, ...] = (
    _Form(
        "queries", POOLING_DECIDES, str, _WORDS_QUERIES.__getitem__, "queries", "ROWS", _read_one_of(("pool", "all"))
    ),
    _Form(
        "isolate_bos",
        POOLING_DECIDES,
        lambda v: f"bos{int(v)}",
        lambda v: f"BOS {'in its own basket' if v else 'in the first basket'}",
        "isolate_bos",
        "BOOL",
        _read_bool,
        text=lambda v: str(v).lower(),
    ),
    _Form(
        "isolate_eos",
        POOLING_DECIDES,
        lambda v: f"eos{int(v)}",
        lambda v: f"EOS {'in its own basket' if v else 'in the last basket'}",
        "isolate_eos",
        "BOOL",
        _read_bool,
        text=lambda v: str(v).lower(),
    ),
    _Form(
        "bos_weight",
        "original",
        lambda v: f"bw{v}",
        lambda v: f"BOS {_mass_words(v)}",
        "bos_weight",
        "SHARE",
        _read_share,
    ),
    _Form(
        "eos_weight", "equal", lambda v: f"ew{v}", lambda v: f"EOS {_mass_words(v)}", "eos_weight", "SHARE", _read_share
    ),
    _Form(
        "prior",
        None,
        lambda v: f"prior{v.bins}x{len(v.values)}.{v.digest()}",
        lambda v: f"each basket divided by the positional prior ({v.bins} bins)",
        "prior",
        "FILE",
        lambda value, where: load_prior(value),
        keyed_at_default=False,
    ),
    _Form(
        "self_share",
        None,
        lambda v: f"self{v:g}",
        lambda v: f"keeping {v:g} of each row's self-attention",
        "self",
        "RHO",
        _read_rho,
        text=_number,
        keyed_at_default=False,
    ),
    _Form(
        "trailing",
        "basket",
        lambda v: f"trail{v}",
        _WORDS_TRAILING.__getitem__,
        "trailing",
        "POLICY",
        _read_one_of(TRAILING),
        keyed_at_default=False,
    ),
    _Form(
        "schedule",
        "flat",
        str,
        lambda v: (
            f"the strength {v} linearly over the calibrated layers (full in the {'last' if v == 'rising' else 'first'})"
        ),
        "schedule",
        "SCHEDULE",
        _read_one_of(SCHEDULES),
        keyed_at_default=False,
    ),
    _Form(
        "head_strengths",
        None,
        _heads_label,
        lambda v: f"per-head strengths in layers {', '.join(str(i) for i, _ in v)}",
        "heads",
        "LAYER:S/S/...",
        _read_heads,
        text=_heads_text,
        keyed_at_default=False,
    ),
    _Form(
        "temperature",
        None,
        lambda v: f"T{v:g}",
        lambda v: f"attention temperature {v:g} (TempScale)",
        "temp",
        "T",
        _read_temperature,
        text=_number,
        keyed_at_default=False,
    ),
)
_FORM_BY_FIELD = {form.field: form for form in _FORMS}
_FORM_BY_NAME = {form.name: form for form in _FORMS}
#: the fields ``special=SHARE`` sets (BOS and EOS isolated, both given SHARE)
_SPECIAL_FIELDS = ("isolate_bos", "isolate_eos", "bos_weight", "eos_weight")
#: the order spec() writes its settings in ("special" stands for the four fields it sets, when it can)
_SPEC_ORDER = (
    "prior",
    "self_share",
    "special",
    *_SPECIAL_FIELDS,
    "queries",
    "trailing",
    "schedule",
    "head_strengths",
    "temperature",
)
_KNOWN_SETTINGS = ", ".join(
    "special=SHARE" if n == "special" else f"{_FORM_BY_FIELD[n].name}={_FORM_BY_FIELD[n].hint}" for n in _SPEC_ORDER
)


def parse_layers(text: str) -> int | float | tuple[int, ...]:
    """The CLI form of ``layers``: ``6`` (last 6), ``0.5`` (last half), ``3+4+5`` (explicit indices) or ``5+``
    (the one index 5)."""
    text = text.strip()
    try:
        if "+" in text:
            return tuple(
                int(x) for x in (text[:-1] if text.count("+") == 1 and text.endswith("+") else text).split("+")
            )
        if "." in text or "e" in text.lower():
            return float(text)
        return int(text)
    except ValueError:
        raise ValueError(
            f"layers must be an int (last k layers), a fraction like 0.5, or indices like 3+4+5; got {text!r}"
        ) from None
