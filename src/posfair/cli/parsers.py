"""The parsers of option values: each takes the text given on the command line (or a default).

A parser raises ``typer.BadParameter`` with what is wrong and the value; the error
boundary (:mod:`posfair.cli.error_boundary`) prints it as one line ``error: --option value:
...`` with exit code 2, before the command runs.  Lists: :func:`comma_list` parses
one occurrence (``en,de``), :func:`joined` (the option's callback) joins repeated
occurrences.  Imports only typer and the standard library; the calibration parsers
import ``posfair.calibration.params`` only when they run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import typer

__all__ = [
    "calibration_spec",
    "layer_spec",
    "layers_text",
    "calibration_text",
    "integer",
    "number",
    "lang_code",
    "mixed_config",
    "name_part",
    "comma_list",
    "joined",
    "choice",
    "device_name",
    "late_chunks",
    "special_share",
]


def _bad(message: str) -> typer.BadParameter:
    return typer.BadParameter(message)


def calibration_spec(value: Any):
    """``default``, ``BASKET,LAYERS,STRENGTH[,NAME=VALUE...]`` or a label (``B128-L0.5-a0.5``) as a
    :class:`~posfair.calibration.params.Calibration` (:meth:`~posfair.calibration.params.Calibration.parse`)."""
    from posfair.calibration.params import Calibration

    if not isinstance(value, str):
        return value
    try:
        return Calibration.parse(value)
    except ValueError as exc:
        raise _bad(str(exc)) from None


def layer_spec(value: Any):
    """``6`` (the last 6 layers), ``0.5`` (the last half) or ``3+4+5`` (0-based indices), checked as a calibration checks it."""
    from posfair.calibration.params import Calibration, parse_layers

    if not isinstance(value, str):
        return value
    try:
        layers = parse_layers(value)
        Calibration(
            layers=layers
        )  # the same rules as a calibration's layers (>= 1, a fraction in (0, 1], distinct indices)
    except ValueError as exc:
        raise _bad(str(exc).replace("layers as", "as")) from None
    return layers


def layers_text(layers: Any) -> str:
    """A parsed layer spec as it is written on the command line (``(0, 99)`` -> ``0+99``)."""
    return "+".join(str(i) for i in layers) if isinstance(layers, (tuple, list)) else str(layers)


def calibration_text(cal: Any) -> str:
    """A calibration as it is written on the command line: ``BASKET,LAYERS,STRENGTH[,variants]`` (a prior as ``prior=PRIOR.json``)."""
    return cal.spec()


def integer(low: int | None = None, high: int | None = None) -> Callable[[Any], int]:
    """A parser of a whole number in ``[low, high]``."""

    def parse(value: Any) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise _bad(f"must be a whole number; got {value!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            if high is None:
                raise _bad(f"must be >= {low}; got {value}")
            raise _bad(f"must be in [{low}, {high}]; got {value}")
        return value

    return parse


def number(low: float, high: float, *, low_open: bool = False, high_open: bool = False) -> Callable[[Any], float]:
    """A parser of a finite number in the interval from ``low`` to ``high`` (open ends as asked)."""
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(value: Any) -> float:
        if isinstance(value, str):
            try:
                value = float(value.strip())
            except ValueError:
                raise _bad(f"must be a number in {shown}; got {value!r}") from None
        value = float(value)
        below = value <= low if low_open else value < low
        above = value >= high if high_open else value > high
        if math.isnan(value) or below or above:
            raise _bad(f"must be a number in {shown}; got {value:g}")
        return value

    return parse


_LANG = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")


def lang_code(value: str) -> str:
    """A language code: ``en``, ``deu``, ``pt-BR`` or PosIR's ``eng-Latn``."""
    value = value.strip()
    if not _LANG.match(value):
        raise _bad(f"{value!r} is not a language code (e.g. en, de, eng-Latn)")
    return value


def mixed_config(value: str) -> str:
    """``LEAD:LATER``, two different language codes (e.g. ``de:en``)."""
    parts = value.split(":")
    if len(parts) != 2:
        raise _bad(f"takes LEAD:LATER (e.g. de:en); got {value!r}")
    lead, later = (lang_code(p) for p in parts)
    if lead == later:
        raise _bad(f"{value!r} has the same language twice; use --lang {lead} for a monolingual configuration")
    return f"{lead}:{later}"


def name_part(value: Any) -> str:
    """A name used as one folder name: not empty, no path separator, not ``.`` or ``..``."""
    text = str(value)
    if not text.strip() or "/" in text or "\\" in text or text in (".", ".."):
        raise _bad(f"must be a plain name (it becomes a folder name); got {text!r}")
    return text


def comma_list(item: Callable[[str], Any]) -> Callable[[Any], list]:
    """A parser of ``a,b,c`` into ``[item(a), item(b), item(c)]`` (a default passes through)."""

    def parse(value: Any) -> list:
        if not isinstance(value, str):
            return list(value) if isinstance(value, (list, tuple)) else [value]
        parts = [p.strip() for p in value.split(",")]
        if not any(parts):
            raise _bad("is empty")
        if not all(parts):
            raise _bad(f"has an empty item: {value!r}")
        return [item(p) for p in parts]

    return parse


def joined(values: Any) -> list:
    """The items of every occurrence of a list option, in order, repeats dropped: ``--lang en,de --lang fr``."""
    out: list = []
    for v in values or ():
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if x not in out:
                out.append(x)
    return out


def choice(*allowed: str) -> Callable[[Any], str]:
    """One of ``allowed`` (lower-case names; ``Webb`` is ``webb``); the error lists them."""

    def parse(value: Any) -> str:
        text = str(value).strip()
        if text.lower() not in allowed:
            raise _bad(f"must be one of {', '.join(allowed)}; got {text!r}")
        return text.lower()

    return parse


def special_share(value: Any) -> Any:
    """A special-token share: ``original``, ``equal`` or a number in [0, 1)."""
    text = str(value).strip().lower()
    if text in ("original", "equal"):
        return text
    try:
        x = float(text)
    except ValueError:
        raise _bad(f"must be 'original', 'equal' or a number in [0, 1); got {value!r}") from None
    if not 0 <= x < 1:
        raise _bad(f"must be 'original', 'equal' or a number in [0, 1); got {value!r}")
    return x


def device_name(value: Any) -> Any:
    """The syntax of a torch device: ``cpu``, ``cuda``, ``cuda:1``, ``mps``, ... (availability is checked later)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not re.match(r"^[a-z_]+[a-z0-9_]*(:\d+)?$", text):
        raise _bad(f"{value!r} is not a device name (e.g. cpu, cuda, cuda:1, mps)")
    return text


def late_chunks(value: Any) -> Any:
    """``semantic`` (SEA's semantic chunks) or a whole number of tokens >= 1 (fixed token windows)."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if text == "semantic":
        return text
    if not re.fullmatch(r"\d+", text) or int(text) < 1:
        raise _bad(f"must be 'semantic' or a whole number of tokens >= 1; got {value!r}")
    return int(text)
