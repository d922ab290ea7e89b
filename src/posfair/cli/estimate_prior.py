"""``posfair estimate-prior``: the stock model's positional prior, for positional-prior calibration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from posfair.cli import checks
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
    Seed,
    TrustRemoteCode,
)


def estimate_prior_command(
    out: Annotated[Path, typer.Option("--out", "-o", metavar="FILE.json", help="Where to write the prior (JSON).")],
    model: Model = None,
    corpus: Corpus = None,
    n: Ns = (3,),
    langs: Langs = ("en",),
    calibration: CalibrationOption = None,
    bins: Bins = 20,
    max_docs: Docs = DOCS_DEFAULT,
    batch_size: BatchSize = 32,
    seed: Seed = 0,
    max_seq_length: MaxSeqLength = None,
    trust_remote_code: TrustRemoteCode = False,
    device: Device = None,
) -> None:
    """Estimate the stock model's mean attention over relative position (one vector per layer) on segment-set documents.

    Use the file as a calibration variant: --calibration 16,1.0,1,prior=FILE.json.  Without --calibration the prior
    covers every layer with the model's default BOS/EOS isolation; with one, its layers and isolation."""
    from posfair.calibration.params import Calibration
    from posfair.cli.error_boundary import data_errors
    from posfair.cli.inputs import build_documents, load_corpus
    from posfair.cli.terminal import say
    from posfair.files.atomic import atomic_write_text

    checks.output_file(out, (".json",))
    model_options = checks.ModelOptions(
        model, max_seq_length=max_seq_length, trust_remote_code=trust_remote_code, device=device
    ).checked()
    data = load_corpus(corpus, sorted(set(langs)))
    fm = checks.load_model(model_options)
    base = calibration if calibration is not None else Calibration(layers=1.0)
    checks.check_calibrations(fm, [base])
    from posfair.attention.prior_estimate import estimate_prior

    with data_errors():
        docs = [d.text for lang in langs for k in n for d in build_documents(fm, data, lang, k, max_docs, seed)]
        est = estimate_prior(fm, docs, base, bins=bins, batch_size=batch_size)
    body = est.to_dict() | {"model": fm.display_name, "fingerprint": fm.fingerprint, "langs": list(langs), "n": n}
    atomic_write_text(out, json.dumps(body, indent=1))
    prior = est.calibration.prior
    for layer, v in zip(prior.layers or ("all",), prior.values, strict=True):
        say(f"layer {layer}: first bin {v[0]:.3f}, last bin {v[-1]:.3f}, max/min {max(v) / min(v):.2f}")
    skipped = f"; {est.skipped} shorter than {bins} content tokens left out" if est.skipped else ""
    say(f"{est.documents} documents{skipped}; prior in {out} (use: --calibration B,LAYERS,STRENGTH,prior={out})")
