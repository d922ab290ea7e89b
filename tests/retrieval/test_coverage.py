"""Calibrated share in retrieval: evaluator, sweep (no-op grid points skipped and marked), tables."""

from __future__ import annotations

import functools
import json
import math
import warnings

import pytest
from tests.retrieval.conftest import aligned_corpus

from posfair import Calibration
from posfair.calibration.coverage import CalibrationFallbackWarning
from posfair.retrieval.benchmarks import build_from_corpus, load_posir
from posfair.retrieval.evaluator import PositionalRetrievalEvaluator, RetrievalResult
from posfair.retrieval.result_tables import bucket_table, group_table, to_latex, to_markdown
from posfair.retrieval.resumable_sweep import run_sweep

# the bundled MiniLM is mean-pooled: a document is calibrated iff its token count n >= B + 1
PARTIAL = Calibration(basket_size=147, layers=0.5, strength=1.0)  # documents of 145, 146, 148, 150 tokens -> 2 of 4
NOOP = Calibration(basket_size=1024, layers=1, strength=1.0)  # longer than any document (max_seq_length 256)
FULL = Calibration(basket_size=16, layers=0.5, strength=0.5)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    out = build_from_corpus(
        aligned_corpus(), tmp_path_factory.mktemp("bench"), langs=["en", "de"], k=3, seed=3, max_doc_tokens=None
    )
    return load_posir(out, lang="en")


def test_document_lengths_of_the_fixture(model, bench):
    assert sorted(model.encoded_lengths(bench.corpus_texts).tolist()) == [145, 146, 148, 150]


def test_evaluator_reports_the_share_once(model, bench):
    ev = PositionalRetrievalEvaluator(bench, PARTIAL, encode_chunk=1)  # four encode calls, one report
    assert ev.calibrated_share(model) == 0.5
    assert PositionalRetrievalEvaluator(bench).calibrated_share(model) is None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = ev.evaluate(model)
    msgs = [str(w.message) for w in caught if issubclass(w.category, CalibrationFallbackWarning)]
    assert msgs == [f"{bench.name}, {PARTIAL.label()}: calibrated share 0.500 of 4 documents (the other 50.0% were encoded stock; "
                    "documents shorter than one basket of 147 content tokens are encoded stock)"]  # fmt: skip
    assert res.calibrated_share == 0.5 and not res.noop
    assert RetrievalResult.from_dict(json.loads(json.dumps(res.to_dict()))).calibrated_share == 0.5
    assert ev(model)[f"{ev.name}_calibrated_share"] == 0.5


def test_sweep_marks_a_noop_grid_point_and_never_evaluates_it(model, bench, tmp_path):
    encoded_with = []
    original = model.encode

    @functools.wraps(original)
    def spy(*args, **kwargs):
        encoded_with.append(kwargs.get("calibration"))
        return original(*args, **kwargs)

    model.encode = spy
    try:
        results = run_sweep(model, bench, [FULL, PARTIAL, NOOP], tmp_path)
    finally:
        del model.encode
    assert NOOP not in encoded_with  # skipped: not a single document encoded with it
    by = {r.setting: r for r in results}
    assert by["stock"].calibrated_share is None
    assert by[FULL.label()].calibrated_share == 1.0
    assert by[PARTIAL.label()].calibrated_share == 0.5
    noop = by[NOOP.label()]
    assert noop.noop and noop.calibrated_share == 0.0 and noop.metrics == {} and not noop.evaluated
    saved = json.loads(next((tmp_path / "runs").glob(f"{NOOP.label()}-*.json")).read_text())
    assert saved["calibrated_share"] == 0.0 and saved["metrics"] == {}

    t = group_table(results)
    assert "calibrated_share" in t.columns
    row = t[t["setting"] == NOOP.label()]  # the setting's one name; its empty cells and share 0 say it is a no-op
    assert len(row) == 1
    r = row.iloc[0]
    assert r["calibrated_share"] == 0.0 and not r["best"]
    assert all(math.isnan(r[c]) for c in ("seg 1", "seg 2", "seg 3", "Harm", "PSI", "nDCG@10"))  # no figures presented
    shares = dict(zip(t["setting"], t["calibrated_share"], strict=True))
    assert math.isnan(shares["stock"]) and shares[PARTIAL.label()] == 0.5 and shares[FULL.label()] == 1.0
    md, tex = to_markdown(t), to_latex(t)
    noop_line = next(line for line in md.split("\n") if line.startswith(f"| {NOOP.label()} "))
    cells = [c.strip() for c in noop_line.strip().strip("|").split("|")]
    assert cells[cells.index(NOOP.label()) + 1 :][:7] == ["-"] * 6 + ["0.000"]  # no figures; share 0
    stock_line = next(line for line in md.split("\n") if line.startswith(("| stock ", "| **stock** ")))
    assert stock_line.rstrip(" |").split("|")[-1].strip().strip("*") == "—"  # stock share shown as —
    assert "calibrated share" in tex and "---" in tex
    b = bucket_table(results)
    nb = b[b["setting"] == NOOP.label()].iloc[0]
    assert nb["calibrated_share"] == 0.0 and math.isnan(nb["nDCG@10"]) and math.isnan(nb["ΔnDCG@10"])
    for name in ("table_groups.csv", "table_groups.md", "table_buckets.tex"):
        assert "calibrated" in (tmp_path / name).read_text()
    # the re-run reads the no-op record back and rebuilds identical tables
    before = (tmp_path / "table_groups.md").read_text()
    again = run_sweep(model, bench, [FULL, PARTIAL, NOOP], tmp_path)
    assert [x.calibrated_share for x in again] == [x.calibrated_share for x in results]
    assert (tmp_path / "table_groups.md").read_text() == before
