"""``posfair attention``: where the pooling token looks, stock vs calibrated, per language."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from posfair.calibration.coverage import SHARE_NAME
from posfair.cli import checks
from posfair.cli.inputs import build_documents
from posfair.cli.options import (
    DOCS_DEFAULT,
    BatchSize,
    Bins,
    CalibrationOption,
    Corpus,
    Device,
    Docs,
    Langs,
    MaxSeqLength,
    Model,
    Ns,
    OutFolder,
    ProfileBasketSize,
    ProfileLayers,
    Seed,
    TrustRemoteCode,
)
from posfair.cli.parsers import layers_text


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """Everything ``posfair attention`` runs with, built once by the command and passed down as one value:
    ``--calibration`` resolved when it is made (STOCK when not given), the folder and the model's source by
    :meth:`checked`, before any work; ``--profile-layers`` against the model once it is loaded."""

    out: Path
    model: checks.ModelOptions
    corpus: str | None = None
    n: tuple[int, ...] = (3,)
    langs: tuple[str, ...] = ("en",)
    layers: Any = None
    basket_size: int = 128
    bins: int = 20
    calibration: Any = None
    max_docs: int = DOCS_DEFAULT
    batch_size: int = 32
    seed: int = 0

    def __post_init__(self) -> None:
        n = [self.n] if isinstance(self.n, int) else self.n
        object.__setattr__(self, "n", tuple(n))
        object.__setattr__(self, "langs", tuple(self.langs))  # a list from the parser: frozen as a tuple
        object.__setattr__(self, "calibration", checks.calibration(self.calibration))  # STOCK when not given

    def checked(self) -> AttentionOptions:
        """These options once the output folder and the model's source and device are checked."""
        checks.output_folder(self.out, command="attention")
        self.model.checked()
        return self


def run_attention(model, corpus, options: AttentionOptions, *, model_name="", progress=None):
    """Profiles per language (stock and, if given, calibrated); writes arrays, figures and an HTML page."""
    from posfair.attention.profile import attention_profile
    from posfair.attention.render import write_attention_report
    from posfair.calibration import STOCK
    from posfair.corpus import corpus_content_fingerprint
    from posfair.files.run_folder import RunFolder

    o = options
    key = {
        "model": model.fingerprint,
        "corpus": corpus_content_fingerprint(corpus),
        "langs": list(o.langs),
        "n": list(o.n),
        "layers": None if o.layers is None else str(o.layers),
        "basket_size": o.basket_size,
        "bins": o.bins,
        "calibration": o.calibration.key(),
        "max_docs": o.max_docs,
        "seed": o.seed,
    }
    profiles = []
    with RunFolder(o.out, "attention", key):
        for lang in o.langs:
            docs = [d for k in o.n for d in build_documents(model, corpus, lang, k, o.max_docs, o.seed)]  # every n
            for cal in [STOCK] + ([] if o.calibration is STOCK else [o.calibration]):
                tick = progress(f"{lang} · {cal.label()}", len(docs)) if progress else None
                prof = attention_profile(
                    model,
                    docs,
                    layers=o.layers,
                    basket_size=o.basket_size,
                    n_bins=o.bins,
                    calibration=cal,
                    batch_size=o.batch_size,
                    group=lang,
                    model_name=model_name,
                    progress=tick,
                )
                prof.save(o.out / f"attention_{lang}_{cal.key()}")
                profiles.append(prof)
        report = write_attention_report(profiles, o.out, title=f"Attention profile — {model_name or 'model'}")
    return profiles, report


#: what the attention table's columns hold (one line each)
ATTENTION_LEGEND = "\n".join(
    (
        f"documents, baskets: counts; {SHARE_NAME}: fraction of the documents the calibration changes (— for stock)",
        "BOS, EOS, first basket, last basket: mean attention mass (0-1) on that key span, from the queries in the title",
        "first half / second half (bins): the ratio of attention mass on the first half of the positions to the second",
    )
)


def _cell(key: str, value) -> str:
    """One precision per kind of column: counts as integers, the share and attention masses with 4 decimals."""
    from posfair.calibration.coverage import format_share

    if key == "calibrated_share":
        return format_share(value)
    if key in ("documents", "baskets"):
        return f"{value:.0f}"
    return f"{value:.4f}"


def attention(
    out: OutFolder = Path("posfair-attention"),
    model: Model = None,
    corpus: Corpus = None,
    n: Ns = (3,),
    langs: Langs = ("en",),
    layers: ProfileLayers = None,
    basket_size: ProfileBasketSize = 128,
    bins: Bins = 20,
    calibration: CalibrationOption = None,
    max_docs: Docs = DOCS_DEFAULT,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
) -> None:
    """Profile the pooling token's attention over segment-set documents (stock vs calibrated)."""
    options = AttentionOptions(
        out=out,
        model=checks.ModelOptions(
            model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device
        ),
        corpus=corpus,
        n=n,
        langs=langs,
        layers=layers,
        basket_size=basket_size,
        bins=bins,
        calibration=calibration,
        max_docs=max_docs,
        batch_size=batch_size,
        seed=seed,
    )
    attention_run(options)


def attention_run(options: AttentionOptions) -> None:
    """Check everything, read the corpus, load the model, profile and print the table."""
    o = options.checked()
    # the model and the plots are imported only when they are needed, after the checks (--help and mistakes stay fast)
    from posfair.attention.profile import resolve_layers
    from posfair.cli.error_boundary import data_errors, naming
    from posfair.cli.inputs import load_corpus
    from posfair.cli.terminal import say, table
    from posfair.cli.terminal_progress import progress_bars

    data = load_corpus(o.corpus, sorted(set(o.langs)))
    fm = checks.load_model(o.model)
    with naming("--profile-layers", layers_text(o.layers)):
        resolve_layers(o.layers, fm.num_layers)
    checks.check_calibrations(fm, [o.calibration])
    t0 = time.perf_counter()
    with progress_bars() as bar, data_errors():  # e.g. too few topics of a language for --n
        profiles, report = run_attention(fm, data, o, model_name=fm.display_name, progress=bar)
    first = profiles[0]
    keys = list(first.summary())
    rows = []
    for p in profiles:
        s = p.summary()
        values = [_cell(k, s.get(k, float("nan"))) for k in keys]
        rows.append([p.group, p.label, *values])
    title = f"Attention profile ({first.query_label}, layers {list(first.layers)}; {time.perf_counter() - t0:.0f} s)"
    header = ["lang", "profile", *(SHARE_NAME if k == "calibrated_share" else k for k in keys)]
    table(title, header, rows, keys=2, caption=ATTENTION_LEGEND)
    say(f"report: {report}")
