"""How each calibration setting is written and read back: one table (:data:`_FORMS`), a row per setting beyond
``B,layers,alpha``, from which :meth:`~posfair.calibration.params.Calibration.label` (short, for tables),
:meth:`~posfair.calibration.params.Calibration.describe` (in words), :meth:`~posfair.calibration.params.Calibration.spec`
(the command line) and :meth:`~posfair.calibration.params.Calibration.parse` (which reads ``spec`` back exactly) are
written; :func:`read_label`, the inverse of ``label()`` (each row's ``token``); and :func:`parse_layers`, the
command-line form of ``layers``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
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


def did_you_mean(word: str, known: Any) -> str:
    """``"; did you mean 'default'?"`` when ``word`` is close to one of ``known`` (a misspelling), else ``""``."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def _read_one_of(allowed: tuple[str, ...]) -> Callable[[str, str], str]:
    def read(value: str, where: str) -> str:
        if value not in allowed:
            raise ValueError(
                f"{where} must be {', '.join(allowed[:-1])} or {allowed[-1]}; got {value!r}{did_you_mean(value, allowed)}"
            )
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
    token: str = ""  # the regular expression its label() token matches, the value in its one group
    unlabel: Callable[[str, str], Any] | None = None  # read_label()'s reading of that group (None: a digest only)
    token_hint: str = ""  # the token in error messages (``trail<policy>``)

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
        "queries",
        POOLING_DECIDES,
        str,
        _WORDS_QUERIES.__getitem__,
        "queries",
        "ROWS",
        _read_one_of(("pool", "all")),
        token="(pool|all)",
        unlabel=_read_one_of(("pool", "all")),
        token_hint="pool|all",
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
        token="bos([01])",
        unlabel=lambda v, where: v == "1",
        token_hint="bos0|bos1",
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
        token="eos([01])",
        unlabel=lambda v, where: v == "1",
        token_hint="eos0|eos1",
    ),
    _Form(
        "bos_weight",
        "original",
        lambda v: f"bw{v}",
        lambda v: f"BOS {_mass_words(v)}",
        "bos_weight",
        "SHARE",
        _read_share,
        token="bw(.+)",
        unlabel=_read_share,
        token_hint="bw<share>",
    ),
    _Form(
        "eos_weight",
        "equal",
        lambda v: f"ew{v}",
        lambda v: f"EOS {_mass_words(v)}",
        "eos_weight",
        "SHARE",
        _read_share,
        token="ew(.+)",
        unlabel=_read_share,
        token_hint="ew<share>",
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
        token=r"prior(\d+x\d+\.[0-9a-f]+)?",  # figure_label() writes it without its shape and digest
        token_hint="prior",
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
        token="self(.+)",
        unlabel=_read_rho,
        token_hint="self<rho>",
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
        token="trail(.+)",
        unlabel=_read_one_of(TRAILING),
        token_hint="trail" + "|trail".join(TRAILING[1:]),
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
        token=f"({'|'.join(SCHEDULES)})",
        unlabel=_read_one_of(SCHEDULES),
        token_hint="|".join(SCHEDULES[1:]),
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
        token=r"heads(\d+x\d+\.[0-9a-f]+)?",
        token_hint="heads<layers>x<heads>.<digest>",
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
        token="T(.+)",
        unlabel=_read_temperature,
        token_hint="T<temperature>",
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


# -- reading a label back: the inverse of Calibration.label() (and of figure_label()) ---------------------------

#: what a label is, for the messages that refuse one
LABEL_FORMAT = (
    "a calibration label is B<basket>-L<layers>-a<strength>[-<setting>...] as tables and figures print it, "
    "e.g. B128-L0.5-a0.5, B64-Llast1-a1 or B16-L3+4-a0.75-rising"
)
_LABEL_START = re.compile(r"B\d")
#: the label's tokens, cut at each "-" that a letter follows (an exponent's "-" is followed by a digit: a1e-05)
_TOKEN_START = re.compile(r"-(?=[^\d])")
#: what a token that names a value by its digest only stands for
_DIGESTED = {
    "prior": ("positional prior", "its file (the JSON posfair estimate-prior writes)"),
    "head_strengths": ("per-head strengths", "them"),
}


def is_label(text: str) -> bool:
    """Whether ``text`` is written as a label (``B128-L0.5-a0.5``) rather than as a spec (``128,0.5,0.5``)."""
    return bool(_LABEL_START.match(text.strip()))


def _label_layers(text: str, bad: Callable[[str], ValueError]) -> int | float | tuple[int, ...]:
    """``layers`` from what a label writes after its ``L`` (:func:`layers_label`): ``last6``, ``all``, ``0.5``,
    ``3+4+5`` or ``5+``; a bare whole number is refused as ambiguous (the last layers, or one index?)."""
    if text == "all":
        return 1.0
    if (last := re.fullmatch(r"last(\d+)", text)) is not None:
        return int(last.group(1))
    if re.fullmatch(r"\d+", text):
        raise bad(
            f"L{text} is ambiguous: Llast{text} is the last {text} layers, L{text}+ the layer with index {text} "
            "(0-based), and a share of the layers has a dot (L0.5)"
        )
    if "+" in text:
        try:
            return parse_layers(text)
        except ValueError:
            pass
    else:
        try:
            return float(text)
        except ValueError:
            pass
    raise bad(f"L{text}: the layers are last<k>, all, a share such as 0.5, or 0-based indices such as 3+4+5 or 5+")


def _match_token(token: str) -> tuple[_Form, re.Match] | None:
    for form in _FORMS:
        if (found := re.fullmatch(form.token, token)) is not None:
            return form, found
    return None


def _label_settings(tokens: list[str], bad: Callable[[str], ValueError]) -> tuple[dict[str, Any], dict[str, str]]:
    """The fields the tokens after ``a<strength>`` set, and the tokens that name a value by its digest only (by
    field: the value is given after the label)."""
    kw: dict[str, Any] = {}
    digested: dict[str, str] = {}
    seen: dict[str, str] = {}  # field -> the token that set it
    hints = ", ".join([form.token_hint for form in _FORMS] + ["special=<share>"])
    for token in tokens:
        if token.startswith("special="):  # figure_label(): BOS and EOS isolated, both given the share
            try:
                share = _read_share(token.partition("=")[2], token)
            except ValueError as exc:
                raise bad(str(exc)) from None
            fields = {f: share if "weight" in f else True for f in _SPECIAL_FIELDS}
        elif (matched := _match_token(token)) is not None:
            form, found = matched
            if form.unlabel is None:  # a digest only: the value follows the label (_digested_values)
                digested[form.field] = token
                fields = {form.field: None}
            else:
                try:
                    fields = {form.field: form.unlabel(found.group(1), token)}
                except ValueError as exc:
                    raise bad(str(exc)) from None
        else:
            words = [h for hint in hints.split(", ") for h in hint.split("|") if "<" not in h]
            raise bad(f"unknown setting {token!r} (known: {hints}){did_you_mean(token, words)}")
        for field in fields:
            if field in seen:
                raise bad(f"{seen[field]!r} and {token!r} both set {field}")
            seen[field] = token
        kw.update(fields)
    return kw, digested


def _digested_values(
    digested: dict[str, str], tail: list[str], label: str, bad: Callable[[str], ValueError]
) -> dict[str, Any]:
    """The values of the tokens that name one by its digest only, from ``NAME=VALUE`` after the label, each checked
    against its token's shape and digest when the token carries one."""
    given: dict[str, str] = {}
    for item in tail:
        name, _, value = (x.strip() for x in item.partition("="))
        form = _FORM_BY_NAME.get(name)
        if form is None or form.field not in _DIGESTED:
            raise bad(
                f"{item!r} after a label: only the values a label names by a digest follow it (prior=FILE, "
                "heads=LAYER:S/S/...); write the setting in the label, or give the whole spec B,LAYERS,STRENGTH,..."
            )
        if form.field not in digested:
            raise bad(f"{name}= after a label that names no {_DIGESTED[form.field][0]} (no -{form.token_hint})")
        if name in given:
            raise bad(f"{name}= given twice")
        given[name] = value
    out: dict[str, Any] = {}
    for field, token in digested.items():
        form = _FORM_BY_FIELD[field]
        what, them = _DIGESTED[field]
        if form.name not in given:
            raise bad(
                f"-{token} names the {what} by {'shape and digest' if token != form.name else 'name'} only, not "
                f"its values: give {them} after the label, {label},{form.name}={form.hint}, or the whole spec "
                f"B,LAYERS,STRENGTH,...,{form.name}={form.hint}"
            )
        value = form.read(given[form.name], f"{form.name}= after calibration label {label!r}")
        stored = tuple(sorted(value.items())) if field == "head_strengths" else value
        if token != form.name and form.label(stored) != token:
            raise bad(f"{form.name}={given[form.name]} is {form.label(stored)}, not the {token} the label names")
        out[field] = stored
    return out


def read_label(text: str) -> dict[str, Any]:
    """The fields of the calibration a label names, as keyword arguments of ``Calibration``: the inverse of
    ``Calibration.label()`` (and of ``figure_label()``, whose ``special=SHARE`` and bare ``prior`` it reads too), so
    that ``Calibration(**read_label(c.label())) == c`` for every setting the label writes exactly (its numbers
    read back: ``%g`` keeps 6 digits).

    A label names a positional prior and per-head strengths by their shape and digest only (``prior20x6.1a2b3c``,
    ``heads2x12.0f1e2d3c``; a figure's bare ``prior``): their values follow the label as in a spec,
    ``LABEL,prior=FILE`` / ``LABEL,heads=LAYER:S/S/...``, and must have the digest the label names.  ValueError
    naming the label and what is wrong otherwise: a missing or unknown token, a setting given twice, layers
    written as a bare whole number (``L6``: the last 6 layers, or the layer with index 6?)."""
    label, *tail = (part.strip() for part in text.strip().split(","))

    def bad(why: str) -> ValueError:
        return ValueError(f"calibration label {label!r}: {why}")

    tokens = _TOKEN_START.split(label)
    head = []
    for pattern, part, token in zip((r"B(\d+)", r"L(.+)", r"a(.+)"), ("B", "L", "a"), tokens + [""] * 3, strict=False):
        found = re.fullmatch(pattern, token)
        if found is None:
            what = {"B": "B<basket>", "L": "L<layers>", "a": "a<strength>"}[part]
            raise bad(f"no {what}" + (f" where it has {token!r}" if token else "") + f"; {LABEL_FORMAT}")
        head.append(found.group(1))
    try:
        strength = float(head[2])
    except ValueError:
        raise bad(f"the strength a{head[2]} is not a number") from None
    kw, digested = _label_settings(tokens[3:], bad)
    kw |= _digested_values(digested, tail, label, bad)
    return dict(basket_size=int(head[0]), layers=_label_layers(head[1], bad), strength=strength, **kw)
