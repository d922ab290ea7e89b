"""Every option two or more commands share, defined once, and the parsers of option values.

A command declares an option as ``model: Model = None``: the alias carries the
flag names and the help text, the default stays in the command's signature
(batch sizes and output folders differ by command).  A bad value is refused
while the command line is parsed, before any work, with one ``error:`` line
naming the option (see :mod:`posfair.cli.errors`).

The vocabulary:

* ``--model/-m``: a hub id or a local folder; ``bundled`` or nothing = the bundled
  all-MiniLM-L6-v2.
* ``--corpus/-c``: a corpus file, folder or dataset (``-c`` means nothing else).
* ``--calibration``: ``default`` or ``BASKET,LAYERS,STRENGTH`` (parsed by
  :meth:`posfair.calibration.params.Calibration.parse` only); repeatable where a
  command compares several.
* lists (``--langs``, ``--n``, ``--mixed``, ``--domains``, ``--baskets``, ...): comma-separated
  (``--langs en,de``); repeating the option adds to the list (``--langs en --langs de``).
* ``--out/-o``, ``--cache``, ``--batch-size``, ``--device``, ``--max-seq-length``,
  ``--seed``, ``--trust-remote-code``, ``--lang``, ``--benchmark/-b``, ...

Only typer and the standard library are imported here (``posfair --help`` stays
fast); the calibration parser imports ``posfair.calibration.params`` when it runs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = [
    "MAX_SEQ_LENGTH_HELP",
    "Model",
    "Corpus",
    "CalibrationOption",
    "Calibrations",
    "BasketSize",
    "CalibrationLayers",
    "Strength",
    "Langs",
    "Lang",
    "OutFolder",
    "OutFile",
    "OutStore",
    "OutResults",
    "OutTune",
    "Cache",
    "TemporaryCache",
    "CorpusOrBenchmark",
    "N",
    "Ns",
    "BatchSize",
    "Device",
    "MaxSeqLength",
    "Seed",
    "TrustRemoteCode",
    "TextField",
    "Prompt",
    "Pooling",
    "Unit",
    "Docs",
    "TuneDocs",
    "ProfileLayers",
    "ProfileBasketSize",
    "GridFlag",
    "GridChoice",
    "Benchmark",
    "OptionalBenchmark",
    "CorpusLang",
    "Domains",
    "QueryPrompt",
    "TopK",
    "Faiss",
    "Sea",
    "Baskets",
    "LayerSets",
    "Strengths",
    "Inference",
    "BootstrapDraws",
    "BootstrapWeights",
    "BootstrapSeed",
]

#: the one help text of every command's ``--max-seq-length`` (the rule is posfair.model.token_limit)
MAX_SEQ_LENGTH_HELP = (
    "Token limit, special tokens included (default: the model's configured max_seq_length, "
    "256 for the bundled all-MiniLM-L6-v2; at most its position limit, 512 there). Recorded in each run's metadata."
)


# -- parsers: each takes the text given on the command line (or a default) and raises
# -- typer.BadParameter, which the error boundary prints as one line naming the option


def _bad(message: str) -> typer.BadParameter:
    return typer.BadParameter(message)


def calibration_spec(value: Any):
    """``default`` or ``BASKET,LAYERS,STRENGTH`` as a :class:`~posfair.calibration.params.Calibration`."""
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
        Calibration(layers=layers)  # the same rules as a calibration's layers (>= 1, a fraction in (0, 1], distinct indices)
    except ValueError as exc:
        raise _bad(str(exc).replace("layers as", "as")) from None
    return layers


def layers_text(layers: Any) -> str:
    """A parsed layer spec as it is written on the command line (``(0, 99)`` -> ``0+99``)."""
    return "+".join(str(i) for i in layers) if isinstance(layers, (tuple, list)) else str(layers)


def calibration_text(cal: Any) -> str:
    """A calibration as it is written on the command line: ``BASKET,LAYERS,STRENGTH`` (its other fields left out)."""
    return f"{cal.basket_size},{layers_text(cal.layers)},{cal.strength:g}"


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
        raise _bad(f"{value!r} has the same language twice; use --langs {lead} for a monolingual configuration")
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
    """The items of every occurrence of a list option, in order, repeats dropped: ``--langs en,de --langs fr``."""
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


def device_name(value: Any) -> Any:
    """The syntax of a torch device: ``cpu``, ``cuda``, ``cuda:1``, ``mps``, ... (availability is checked later)."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not re.match(r"^[a-z_]+[a-z0-9_]*(:\d+)?$", text):
        raise _bad(f"{value!r} is not a device name (e.g. cpu, cuda, cuda:1, mps)")
    return text


# -- the shared options ------------------------------------------------------------------

Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar="ID|FOLDER",
        show_default="bundled",
        help="A Hugging Face hub id or a local model folder; 'bundled' = the bundled all-MiniLM-L6-v2 (offline).",
    ),
]
Corpus = Annotated[
    str | None,
    typer.Option(
        "--corpus",
        "-c",
        metavar="PATH|DATASET",
        show_default="bundled",
        help="A corpus: .jsonl / .parquet file, datasets save_to_disk folder or Hugging Face dataset; 'bundled' = the bundled Debian-documentation corpus.",
    ),
]
CalibrationOption = Annotated[
    Any,
    typer.Option(
        "--calibration",
        metavar="B,LAYERS,STRENGTH",
        parser=calibration_spec,
        show_default="none (stock)",
        help="Calibrate: 'default' (= 128,0.5,0.5) or BASKET,LAYERS,STRENGTH, e.g. 64,1,1.0 or 128,6+7+8,0.5.",
    ),
]
Calibrations = Annotated[
    list[Any],
    typer.Option(
        "--calibration",
        metavar="B,LAYERS,STRENGTH",
        parser=calibration_spec,
        show_default="none",
        help="A calibration to compare with the stock model (repeat the option for several): "
        "'default' (= 128,0.5,0.5) or BASKET,LAYERS,STRENGTH, e.g. 64,1,1.0.",
    ),
]
BasketSize = Annotated[
    int | None,
    typer.Option(
        "--basket-size",
        parser=integer(1),
        metavar="B",
        help="Calibrate with this basket size (overrides --calibration's; alone: the default calibration with it).",
    ),
]
CalibrationLayers = Annotated[
    Any,
    typer.Option(
        "--layers",
        parser=layer_spec,
        metavar="LAYERS",
        help="Calibrated layers: 6 (the last 6), 0.5 (the last half) or 3+4+5 (0-based indices); overrides --calibration's.",
    ),
]
Strength = Annotated[
    float | None,
    typer.Option(
        "--strength",
        parser=number(0, 1),
        metavar="ALPHA",
        help="Calibration strength in [0, 1] (0 = stock, 1 = full); overrides --calibration's.",
    ),
]
Langs = Annotated[
    list[str],
    typer.Option(
        "--langs",
        parser=comma_list(lang_code),
        callback=joined,
        metavar="LANG,...",
        help="Languages, comma-separated (e.g. en,de); repeating the option adds to the list.",
    ),
]
Lang = Annotated[
    str | None,
    typer.Option("--lang", parser=lang_code, metavar="LANG", help="Language (e.g. en, or PosIR's eng-Latn)."),
]
OutFolder = Annotated[Path, typer.Option("--out", "-o", metavar="FOLDER", help="Output folder (created if missing).")]
Cache = Annotated[
    Path | None,
    typer.Option(
        "--cache",
        metavar="FOLDER",
        show_default="a folder inside --out",
        help="Embedding cache folder, kept: a rerun computes only what is missing; shareable with posfair embed.",
    ),
]
# the variants of --out, --cache and --corpus some commands need (a file, a store, a default under ./)
OutFile = Annotated[
    Path,
    typer.Option("--out", "-o", metavar="FILE", help=".npy (float32 matrix, one row per text) or .parquet (one row per text)."),
]
OutStore = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        metavar="FOLDER",
        help="Embedding store folder (the --cache folder audit / retrieval / sweep read); on a cluster, a path every node sees.",
    ),
]
OutResults = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        metavar="FOLDER",
        show_default="./posfair-results/<benchmark>",
        help="Output folder (created if missing); rerunning resumes from its cache.",
    ),
]
OutTune = Annotated[
    Path, typer.Option("--out", "-o", metavar="FOLDER", help="Output folder (created if missing); rerunning resumes the search.")
]
TemporaryCache = Annotated[
    Path | None,
    typer.Option(
        "--cache",
        metavar="FOLDER",
        show_default=".<out>.posfair-cache, removed after success",
        help="Embedding cache folder, kept: a rerun computes only what is missing; shareable with posfair embed.",
    ),
]
CorpusOrBenchmark = Annotated[
    str | None,
    typer.Option(
        "--corpus",
        "-c",
        metavar="PATH|DATASET",
        show_default="bundled",
        help="A posfair corpus, a plain .parquet / .jsonl (--text-field), a Hugging Face dataset, or a benchmark with --part.",
    ),
]
N = Annotated[int, typer.Option("--n", parser=integer(2), metavar="N", help="Segments per document.")]
Ns = Annotated[
    list[int],
    typer.Option(
        "--n", parser=comma_list(integer(2)), callback=joined, metavar="N,...", help="Segments per document, comma-separated (each >= 2)."
    ),
]

BatchSize = Annotated[int, typer.Option("--batch-size", parser=integer(1), metavar="N", help="Texts per encoder batch.")]
Device = Annotated[
    str | None,
    typer.Option(
        "--device",
        parser=device_name,
        metavar="DEVICE",
        show_default="sentence-transformers' choice",
        help="Torch device: cpu, cuda, cuda:1, mps, ...",
    ),
]
MaxSeqLength = Annotated[int | None, typer.Option("--max-seq-length", parser=integer(4), metavar="TOKENS", help=MAX_SEQ_LENGTH_HELP)]
Seed = Annotated[int, typer.Option("--seed", parser=integer(0, 2**32 - 1), metavar="N", help="Random seed (sampling, splits).")]
TrustRemoteCode = Annotated[
    bool, typer.Option("--trust-remote-code", help="Allow code shipped with the model to run (off: only models transformers knows).")
]
TextField = Annotated[str, typer.Option("--text-field", metavar="FIELD", help="Field / column holding the texts.")]
Prompt = Annotated[str | None, typer.Option("--prompt", metavar="TEXT", help="Text prefix for every text (e.g. a query instruction).")]
Pooling = Annotated[
    str | None,
    typer.Option(
        "--pooling",
        parser=choice("cls", "mean", "lasttoken"),
        metavar="cls|mean|lasttoken",
        show_default="the model's",
        help="Override the model's pooling.",
    ),
]
Unit = Annotated[
    str | None,
    typer.Option(
        "--unit",
        metavar="UNIT",
        show_default="section for the bundled corpus",
        help="Keep the corpus rows of this unit (the bundled corpus: section or packed).",
    ),
]

# flags whose meaning depends on the command: each meaning is one alias
Docs = Annotated[int, typer.Option("--docs", parser=integer(1), metavar="N", help="Target documents per instance (paper: ~1,000).")]
TuneDocs = Annotated[int, typer.Option("--docs", parser=integer(1), metavar="N", help="Fairness: documents in dev + test together.")]
ProfileLayers = Annotated[
    Any,
    typer.Option(
        "--layers",
        parser=layer_spec,
        metavar="LAYERS",
        show_default="the last half",
        help="Layers to profile: 6 (the last 6), 0.5 (the last half) or 6+7+8 (0-based indices).",
    ),
]
ProfileBasketSize = Annotated[
    int, typer.Option("--basket-size", parser=integer(1), metavar="B", help="Content keys per basket of the attention profile.")
]
GridFlag = Annotated[bool, typer.Option("--grid/--no-grid", help="The papers' grid: --baskets x --layers x --strengths.")]
GridChoice = Annotated[
    str,
    typer.Option(
        "--grid",
        parser=choice("default", "paper"),
        metavar="default|paper",
        help="default (baskets 16,64,256 x layers 0.5,1.0 x strengths 0.5,1.0) or paper (128,256,512 x 1,0.5 x 0.5,1.0); "
        "--baskets / --layers / --strengths override its values.",
    ),
]

# retrieval, sweep and tune
Benchmark = Annotated[
    str,
    typer.Option(
        "--benchmark",
        "-b",
        metavar="NAME|PATH",
        help="squad-posq | squad-posq-tiny | fineweb-posq | posir | a hub id | a local path (e.g. from posfair build-benchmark).",
    ),
]
OptionalBenchmark = Annotated[
    str | None,
    typer.Option(
        "--benchmark",
        "-b",
        metavar="NAME|PATH",
        show_default="one built from --corpus",
        help="--objective retrieval: a benchmark (name, hub id or path).",
    ),
]
CorpusLang = Annotated[
    str | None,
    typer.Option(
        "--corpus-lang", parser=lang_code, metavar="LANG", show_default="--lang", help="Document language for cross-lingual retrieval."
    ),
]
Domains = Annotated[
    list[str],
    typer.Option(
        "--domains",
        parser=comma_list(name_part),
        callback=joined,
        metavar="DOMAIN,...",
        show_default="all",
        help="PosIR domains, comma-separated.",
    ),
]
QueryPrompt = Annotated[
    str,
    typer.Option(
        "--query-prompt",
        metavar="auto|none|TEXT",
        help="Query prefix: 'auto' (the model's published prompt), 'none', or a string (\\n allowed).",
    ),
]
TopK = Annotated[int, typer.Option("--top-k", parser=integer(1), metavar="K", help="Documents retrieved per query.")]
Faiss = Annotated[bool, typer.Option("--faiss", help="Search with faiss.IndexFlatIP (exact; needs faiss-cpu).")]
Sea = Annotated[bool, typer.Option("--sea", help="Also run the Segment Embed Average baseline (needs chonkie).")]

# sweep and tune: lists of grid values
Baskets = Annotated[
    list[int],
    typer.Option("--baskets", parser=comma_list(integer(1)), callback=joined, metavar="B,...", help="Basket sizes, comma-separated."),
]
LayerSets = Annotated[
    list[Any],
    typer.Option(
        "--layers",
        parser=comma_list(layer_spec),
        callback=joined,
        metavar="LAYERS,...",
        help="Layer sets, comma-separated: 1 (the last layer), 0.5 (the last half), 1.0 (all), 3+4+5 (indices).",
    ),
]
Strengths = Annotated[
    list[float],
    typer.Option(
        "--strengths",
        parser=comma_list(number(0, 1, low_open=True)),
        callback=joined,
        metavar="ALPHA,...",
        help="Calibration strengths in (0, 1], comma-separated.",
    ),
]

# audit and demo: how p-values are computed
Inference = Annotated[
    str,
    typer.Option(
        "--inference",
        parser=choice("cluster", "wild"),
        metavar="cluster|wild",
        help="p-values: 'cluster' = CR1 cluster-robust SEs (clusters = segment sets) with t(G-1); "
        "'wild' = wild cluster bootstrap-t (WCR11). Recorded in the run's metadata.",
    ),
]
BootstrapDraws = Annotated[
    int | None,
    typer.Option("--bootstrap-draws", parser=integer(99), metavar="B", show_default="9999", help="--inference wild: bootstrap draws."),
]
BootstrapWeights = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-weights",
        parser=choice("webb", "rademacher"),
        metavar="webb|rademacher",
        show_default="webb",
        help="--inference wild: six-point Webb weights, or Rademacher (all 2^G sign vectors when 2^G < B).",
    ),
]
BootstrapSeed = Annotated[
    int | None,
    typer.Option(
        "--bootstrap-seed",
        parser=integer(0, 2**32 - 1),
        metavar="N",
        show_default="0",
        help="--inference wild: seed of the bootstrap weights.",
    ),
]


def inference_settings(inference: str, draws: int | None, weights: str | None, seed: int | None) -> dict:
    """``--inference`` and the bootstrap options as AuditSettings keywords; a bootstrap option without ``wild`` is refused."""
    from posfair.errors import PosfairInputError

    given = {"--bootstrap-draws": draws, "--bootstrap-weights": weights, "--bootstrap-seed": seed}
    extra = [k for k, v in given.items() if v is not None]
    if inference != "wild" and extra:
        raise PosfairInputError(f"{', '.join(extra)} applies only to --inference wild (got --inference {inference})")
    from posfair.fairness.ols import Inference as InferenceSpec  # the defaults live with the OLS code

    d = InferenceSpec()
    return dict(
        inference=inference, bootstrap_draws=d.draws if draws is None else draws,
        bootstrap_weights=d.weights if weights is None else weights, bootstrap_seed=d.seed if seed is None else seed,
    )  # fmt: skip
