"""Every option two or more commands share, defined once (``typing.Annotated`` aliases).

A command declares an option as ``model: Model = None``: the alias carries the
flag names and the help text, the default stays in the command's signature
(batch sizes and output folders differ by command).  A bad value is refused
while the command line is parsed, before any work, with one ``error:`` line
naming the option (see :mod:`posfair.cli.error_boundary`).

The vocabulary:

* ``--model/-m``: a hub id or a local folder; ``bundled`` or nothing = the bundled
  all-MiniLM-L6-v2.
* ``--corpus/-c``: a corpus file, folder or dataset (``-c`` means nothing else).
* ``--calibration``: ``default``, ``BASKET,LAYERS,STRENGTH`` or a label ``B128-L0.5-a0.5`` (parsed by
  :meth:`posfair.calibration.params.Calibration.parse` only); repeatable where a
  command compares several.
* lists (``--lang``, ``--n``, ``--mixed``, ``--domains``, ``--baskets``, ...): comma-separated
  (``--lang en,de``); repeating the option adds to the list (``--lang en --lang de``).  Former names
  (``--langs``) still work, hidden from ``--help`` (:mod:`posfair.cli.aliases`).
* ``--max-batch-tokens``: the padded-token budget of one forward pass, ``embed``'s and ``serve``'s one name
  for it (``embed --max-tokens`` still works, hidden, with a one-line warning).
* ``--out/-o``, ``--cache``, ``--batch-size``, ``--device``, ``--max-seq-length``,
  ``--seed``, ``--trust-remote-code``, ``--lang``, ``--benchmark/-b``, ...

Only typer, the standard library and :mod:`posfair.cli.parsers` (the parsers of
option values) are imported here, so ``posfair --help`` stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from posfair.cli.parsers import (
    calibration_spec,
    choice,
    comma_list,
    device_name,
    integer,
    joined,
    lang_code,
    late_chunks,
    layer_spec,
    name_part,
    number,
)

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
    "DOCS_DEFAULT",
    "ProfileLayers",
    "ProfileBasketSize",
    "GridFlag",
    "SpaceChoice",
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


# -- the shared options ------------------------------------------------------------------

Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar="ID|FOLDER",
        show_default="bundled",
        help="A Hugging Face hub id or a local model folder; 'bundled' (= 'bundled:all-minilm-l6-v2') or 'bundled:multilingual-e5-small' run offline.",
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
        metavar="B,LAYERS,STRENGTH[,VARIANT=VALUE]",
        parser=calibration_spec,
        show_default="none (stock)",
        help="Calibrate with 'default' (= 128,0.5,0.5) or BASKET,LAYERS,STRENGTH[,VARIANT=VALUE...], e.g. 64,1,1.0, 128,6+7+8,0.5 or 16,1.0,1,prior=prior.json, or a label as tables print it (B64-Llast1-a1); variants: prior=FILE (posfair estimate-prior), self=RHO, special=original|equal|SHARE, trailing=basket|merge|weighted, schedule=flat|rising|falling.",
    ),
]
Calibrations = Annotated[
    list[Any],
    typer.Option(
        "--calibration",
        metavar="B,LAYERS,STRENGTH[,VARIANT=VALUE]",
        parser=calibration_spec,
        show_default="none (stock only)",
        help="A calibration to compare with the stock model, repeatable: 'default' (= 128,0.5,0.5) or BASKET,LAYERS,STRENGTH[,VARIANT=VALUE...], e.g. 64,1,1.0, 128,6+7+8,0.5 or 16,1.0,1,prior=prior.json, or a label as tables print it (B64-Llast1-a1); variants: prior=FILE (posfair estimate-prior), self=RHO, special=original|equal|SHARE, trailing=basket|merge|weighted, schedule=flat|rising|falling.",
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
        metavar="STRENGTH",
        help="Calibration strength in [0, 1] (0 = stock, 1 = full); overrides --calibration's.",
    ),
]
Langs = Annotated[
    list[str],
    typer.Option(
        "--lang",
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
    typer.Option(
        "--out", "-o", metavar="FILE", help=".npy (float32 matrix, one row per text) or .parquet (one row per text)."
    ),
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
        help="Output folder (created if missing); rerunning resumes from its cache.",
    ),
]
OutTune = Annotated[
    Path,
    typer.Option(
        "--out", "-o", metavar="FOLDER", help="Output folder (created if missing); rerunning resumes the search."
    ),
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
        "--n",
        parser=comma_list(integer(2)),
        callback=joined,
        metavar="N,...",
        help="Segments per document, comma-separated (each >= 2).",
    ),
]

BatchSize = Annotated[
    int, typer.Option("--batch-size", parser=integer(1), metavar="N", help="Texts per encoder batch.")
]
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
MaxSeqLength = Annotated[
    int | None, typer.Option("--max-seq-length", parser=integer(4), metavar="TOKENS", help=MAX_SEQ_LENGTH_HELP)
]
MaxBatchTokens = Annotated[
    int,
    typer.Option(
        "--max-batch-tokens",
        parser=integer(1),
        metavar="TOKENS",
        help=(
            "Padded-token budget of one forward pass (its texts x the longest one's tokens): embed's length "
            "batching, serve's batches of requests arriving together (a /v1/segments batch holds documents of at "
            "most this many tokens in all)."
        ),
    ),
]
Bins = Annotated[int, typer.Option("--bins", parser=integer(1), metavar="N", help="Relative-position bins.")]
Seed = Annotated[
    int, typer.Option("--seed", parser=integer(0, 2**32 - 1), metavar="N", help="Random seed (sampling, splits).")
]
TrustRemoteCode = Annotated[
    bool,
    typer.Option(
        "--trust-remote-code", help="Allow code shipped with the model to run (off: only models transformers knows)."
    ),
]
TextField = Annotated[str, typer.Option("--text-field", metavar="FIELD", help="Field / column holding the texts.")]
Prompt = Annotated[
    str | None, typer.Option("--prompt", metavar="TEXT", help="Text prefix for every text (e.g. a query instruction).")
]
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
#: the one default of --docs: minutes on a 2-core CPU for the bundled model (24 segment sets at n = 3)
DOCS_DEFAULT = 144
Docs = Annotated[
    int,
    typer.Option(
        "--docs",
        parser=integer(1),
        metavar="N",
        help="Target documents per instance (each ordering of a segment set is a document). The default runs in minutes on a CPU; the papers use ~1,000 (--docs 1000) for tighter intervals.",
    ),
]
ProfileLayers = Annotated[
    Any,
    typer.Option(
        "--profile-layers",
        parser=layer_spec,
        metavar="LAYERS",
        show_default="the last half",
        help="Layers averaged in the profile: 6 (the last 6), 0.5 (the last half) or 6+7+8 (0-based indices).",
    ),
]
ProfileBasketSize = Annotated[
    int,
    typer.Option(
        "--profile-basket-size",
        parser=integer(1),
        metavar="B",
        help="Content keys per basket of the profile's absolute view.",
    ),
]
GridFlag = Annotated[
    bool, typer.Option("--grid/--no-grid", help="The papers' grid: --baskets x --layer-sets x --strengths.")
]
# tune's starting grid (named --space: --grid is the sweep's on/off flag, one flag one meaning)
SpaceChoice = Annotated[
    str,
    typer.Option(
        "--space",
        parser=choice("default", "paper"),
        metavar="default|paper",
        help="default (baskets 16,64,256 x layers 0.5,1.0 x strengths 0.5,1.0) or paper (128,256,512 x 1,0.5 x 0.5,1.0); "
        "--baskets / --layer-sets / --strengths override its values.",
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
        "--corpus-lang",
        parser=lang_code,
        metavar="LANG",
        show_default="--lang",
        help="Document language for cross-lingual retrieval.",
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
SearchScope = Annotated[
    str,
    typer.Option(
        "--search-scope",
        parser=choice("domain", "corpus"),
        metavar="domain|corpus",
        help="Search each query among its own domain's documents (default, each subset its own corpus) or the whole corpus.",
    ),
]
Sea = Annotated[bool, typer.Option("--sea", help="Also run the Segment Embed Average baseline (needs chonkie).")]
Late = Annotated[
    list[str],
    typer.Option(
        "--late",
        parser=comma_list(choice("max", "mean")),
        callback=joined,
        metavar="max,mean",
        show_default="none",
        help="Also run late chunking: each passage encoded once (stock), its token states mean-pooled over each chunk, "
        "the document scored by the max and/or mean of the query's cosine to its chunks.",
    ),
]
LateChunks = Annotated[
    Any,
    typer.Option(
        "--late-chunks",
        parser=late_chunks,
        metavar="semantic|TOKENS",
        help="Chunks of --late: 'semantic' (SEA's semantic chunks, needs chonkie) or windows of TOKENS content tokens.",
    ),
]

# sweep and tune: lists of grid values
Baskets = Annotated[
    list[int],
    typer.Option(
        "--baskets",
        parser=comma_list(integer(1)),
        callback=joined,
        metavar="B,...",
        help="Basket sizes, comma-separated.",
    ),
]
LayerSets = Annotated[
    list[Any],
    typer.Option(
        "--layer-sets",
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
        parser=comma_list(number(0, 1)),
        callback=joined,
        metavar="STRENGTH,...",
        help="Calibration strengths in [0, 1], comma-separated (0 = stock: reported as a no-op).",
    ),
]

# audit and demo: how p-values are computed
Inference = Annotated[
    str,
    typer.Option(
        "--inference",
        parser=choice("cluster", "wild"),
        metavar="cluster|wild",
        help="p-values: 'cluster' = CR1 cluster-robust SEs with t(G-1); "
        "'wild' = wild cluster bootstrap-t (WCR11). Recorded in the run's metadata.",
    ),
]
Clusters = Annotated[
    str,
    typer.Option(
        "--clusters",
        parser=choice("conservative", "set+topic", "set", "component"),
        metavar="conservative|set+topic|set|component",
        help="What is a cluster: 'conservative' = per coefficient the wider interval of 'set+topic' and "
        "'component', each with its own G, the one used named in every table (the sets when no topic is shared); "
        "'set+topic' = two-way by segment set and topic (a topic drawn into two sets ties them; equals 'set' when "
        "no topic is shared), 'set' = segment sets (the papers'), 'component' = sets joined by shared topics.",
    ),
]
BootstrapDraws = Annotated[
    int | None,
    typer.Option(
        "--bootstrap-draws",
        parser=integer(99),
        metavar="B",
        show_default="9999",
        help="--inference wild: bootstrap draws.",
    ),
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


def list_option(flag: str, item: Callable[[str], Any], metavar: str, help: str) -> Any:
    """A comma-separated, repeatable list option (``--flag a,b --flag c``), each item parsed by ``item``."""
    return typer.Option(flag, parser=comma_list(item), callback=joined, metavar=metavar, help=help)
