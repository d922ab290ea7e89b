"""``posfair attention``: where the pooling token looks, stock vs calibrated, per language."""

from __future__ import annotations

import time
from pathlib import Path

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


def run_attention(
    model,
    corpus,
    *,
    langs,
    n,
    layers,
    basket_size,
    n_bins,
    calibration,
    max_docs,
    out: Path,
    batch_size=8,
    seed=0,
    model_name="",
    progress=None,
):
    """Profiles per language (stock and, if given, calibrated); writes arrays, figures and an HTML page."""
    from posfair.attention.profile import attention_profile
    from posfair.attention.render import write_attention_report
    from posfair.calibration import STOCK
    from posfair.corpus import corpus_content_fingerprint
    from posfair.run_folder import RunFolder

    ns = [n] if isinstance(n, int) else list(n)
    key = {
        "model": model.fingerprint,
        "corpus": corpus_content_fingerprint(corpus),
        "langs": list(langs),
        "n": ns,
        "layers": None if layers is None else str(layers),
        "basket_size": basket_size,
        "bins": n_bins,
        "calibration": calibration.key(),
        "max_docs": max_docs,
        "seed": seed,
    }
    profiles = []
    with RunFolder(out, "attention", key):
        for lang in langs:
            docs = [d for k in ns for d in build_documents(model, corpus, lang, k, max_docs, seed)]  # every n pooled
            for cal in [STOCK] + ([] if calibration is STOCK else [calibration]):
                tick = progress(f"{lang} · {cal.label()}", len(docs)) if progress else None
                prof = attention_profile(
                    model,
                    docs,
                    layers=layers,
                    basket_size=basket_size,
                    n_bins=n_bins,
                    calibration=cal,
                    batch_size=batch_size,
                    group=lang,
                    model_name=model_name,
                    progress=tick,
                )
                prof.save(out / f"attention_{lang}_{cal.key()}")
                profiles.append(prof)
        report = write_attention_report(profiles, out, title=f"Attention profile — {model_name or 'model'}")
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
    # the model and the plots are imported only when they are needed, after the checks (--help and mistakes stay fast)
    from posfair.attention.profile import resolve_layers
    from posfair.cli.error_boundary import data_errors, naming
    from posfair.cli.inputs import load_corpus
    from posfair.cli.terminal import say, table
    from posfair.cli.terminal_progress import progress_bars

    checks.output_folder(out)
    model_options = checks.ModelOptions(
        model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device
    ).checked()
    data = load_corpus(corpus, sorted(set(langs)))
    fm = checks.load_model(model_options)
    with naming("--profile-layers", layers_text(layers)):
        resolve_layers(layers, fm.num_layers)
    calibration = checks.calibration(calibration)  # STOCK when --calibration is not given
    checks.check_calibrations(fm, [calibration])

    name = fm.display_name
    t0 = time.perf_counter()
    with progress_bars() as bar, data_errors():  # e.g. too few topics of a language for --n
        profiles, report = run_attention(
            fm,
            data,
            langs=langs,
            n=n,
            layers=layers,
            basket_size=basket_size,
            n_bins=bins,
            calibration=calibration,
            max_docs=max_docs,
            out=out,
            batch_size=batch_size,
            seed=seed,
            model_name=name,
            progress=bar,
        )
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
