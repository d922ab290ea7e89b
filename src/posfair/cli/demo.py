"""``posfair demo``: the bundled MiniLM audited on the bundled corpus, stock vs the default calibration."""

from __future__ import annotations

from pathlib import Path

from posfair.cli import checks
from posfair.cli.options import BootstrapDraws, BootstrapSeed, BootstrapWeights, Cache, Docs, Inference, OutFolder

#: The demo: English monolingual n in {3, 4} plus one Latin-script mixed
#: configuration, stock vs the default calibration.  144 documents per instance
#: (n=3: 24 sets x 6 orderings; n=4: 6 sets x 24), 576 documents in all, keeps
#: 4 instances x (stock + calibrated) at a few minutes on 2 idle CPU cores.
#: Documents are up to 512 tokens, the model's position limit: the demo sets
#: ``max_seq_length=512`` explicitly (the model is configured at 256, the default of
#: every other command; at 256 the bundled corpus has too few German/English
#: segment sets short enough for n=4), and the limit is recorded in run.json.
DEMO_SETTINGS = dict(n_values=(3, 4), target_docs=144, seed=0, batch_size=16, max_seq_length=512)
DEMO_MIXED_CANDIDATES = ("de", "fr", "it", "nl", "pt", "es")


def run_demo(out: Path, docs: int | None = None, cache: Path | None = None, inference: dict | None = None):
    """The demo; ``inference``: AuditSettings keywords (``inference``, ``bootstrap_*``), default CR1 + t(G-1)."""
    import posfair
    from posfair.calibration import Calibration
    from posfair.cli.audit import run_audit
    from posfair.corpus import load_corpus
    from posfair.fairness.documents import LanguageConfig
    from posfair.fairness.experiment import AuditSettings

    df = load_corpus()
    langs = set(df["lang"].astype(str))
    if "en" not in langs:
        raise ValueError(f"the bundled corpus has no English part (languages: {sorted(langs)})")
    lead = next((lg for lg in DEMO_MIXED_CANDIDATES if lg in langs), None)
    configs = [LanguageConfig.mono("en")] + ([LanguageConfig(lead, "en")] if lead else [])
    kw = dict(DEMO_SETTINGS)
    if docs is not None:
        kw["target_docs"] = docs
    kw.update(inference or {})
    settings = AuditSettings(configs=tuple(configs), **kw)
    model = posfair.load_model()
    return run_audit(
        model, df, settings, [Calibration()], out, cache, "all-MiniLM-L6-v2 (bundled)", "bundled", "posfair demo: all-MiniLM-L6-v2"
    )


def demo(
    out: OutFolder = Path("posfair-demo"),
    docs: Docs = DEMO_SETTINGS["target_docs"],
    cache: Cache = None,
    inference: Inference = "cluster",
    bootstrap_draws: BootstrapDraws = None,
    bootstrap_weights: BootstrapWeights = None,
    bootstrap_seed: BootstrapSeed = None,
) -> None:
    """Audit the bundled MiniLM on the bundled corpus: English n=3,4 + one mixed configuration, stock vs default calibration, documents up to 512 tokens."""
    inference_kw = checks.inference_settings(inference, bootstrap_draws, bootstrap_weights, bootstrap_seed)
    checks.output_folder(out)
    checks.cache_folder(cache)
    run_demo(out, docs, cache, inference_kw)
