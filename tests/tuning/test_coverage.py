"""The tuner skips grid points that calibrate nothing, says how many, and shows every trial's calibrated share."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from posfair import Calibration
from posfair import encoding as enc
from posfair.calibration import STOCK
from posfair.calibration.coverage import NOOP_LABEL
from posfair.tuning import (
    DEV,
    TEST,
    FairnessObjective,
    FunctionObjective,
    SearchSpace,
    default_fairness_settings,
    run_search,
)
from posfair.tuning.outputs import summary_markdown, trials_table, write_outputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairness"))
from conftest import tiny_corpus  # noqa: E402

SPACE = SearchSpace(
    basket_sizes=(16, 64, 256), layer_sets=(1, 0.5), strengths=(0.5, 1.0), fine_rounds=2, min_step=0.005
)


def score(cal, split):
    if cal is STOCK:
        return {"score": 1.0, "guard": 1.0}
    # B=256 would "win" if it were evaluated: it must never be
    return {
        "score": (cal.strength - 0.7) ** 2 + (-5.0 if cal.basket_size == 256 else 0.0),
        "guard": 1.0 - 0.05 * cal.strength,
    }


def test_noop_grid_points_are_skipped_and_never_candidates(tmp_path):
    evaluated = []

    def fn(cal, split):
        evaluated.append(cal)
        return score(cal, split)

    share = lambda cal, split: 0.0 if cal.basket_size == 256 else 0.75  # noqa: E731
    res = run_search(FunctionObjective(fn, share=share), SPACE, max_drop=0.1, results_path=tmp_path / "tune.json")
    assert not any(c is not STOCK and c.basket_size == 256 for c in evaluated)
    assert sorted(t.label for t in res.skipped) == sorted(c.label() for c in SPACE.coarse() if c.basket_size == 256)
    assert len(res.skipped) == 4 and all(t.calibrated_share == 0.0 and t.split == DEV for t in res.skipped)
    assert res.chosen.basket_size != 256 and all(t.calibration.basket_size != 256 for t in res.front if not t.stock)
    assert all(t.calibrated_share == 0.75 for t in res.trials if t.calibration is not STOCK)
    assert res.trial(STOCK, DEV).calibrated_share is None
    assert res.headline()["skipped"] == 4 and res.headline()["dev_chosen_calibrated_share"] == 0.75
    f = res.frame(DEV)
    assert 256 not in set(f["basket_size"].dropna()) and np.isnan(f.loc[f.label == "stock", "calibrated_share"]).all()
    table = trials_table(res).frame
    assert set(table.loc[table.setting != "stock", "calibrated share"]) == {"0.750"}  # its one display name
    assert table.loc[table.setting == "stock", "calibrated share"].tolist() == ["—"]
    summary = summary_markdown(res)
    assert f"Skipped 4 of 12 grid points ({NOOP_LABEL}" in summary
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert len(saved["skipped"]) == 4 and all(t["calibrated_share"] == 0.0 for t in saved["skipped"])
    paths = write_outputs(res, tmp_path / "out")
    assert "calibrated share" in (tmp_path / "out" / "tables" / "trials.md").read_text()
    trials = paths["trials"].read_text()
    assert trials.count("skipped") == 4
    # a re-run reads every evaluated trial back and skips the same points again
    again = run_search(
        FunctionObjective(lambda c, s: pytest.fail("re-evaluated"), share=share),
        SPACE,
        max_drop=0.1,
        results_path=tmp_path / "tune.json",
    )
    assert again.chosen == res.chosen and len(again.skipped) == 4


def test_a_grid_of_noops_keeps_stock():
    res = run_search(FunctionObjective(score, share=lambda c, s: 0.0), SPACE, max_drop=0.1)
    assert res.chosen is STOCK and not res.feasible
    assert len(res.skipped) == 12 and [t.phase for t in res.trials] == ["stock", "test"]


@pytest.fixture(scope="module")
def model(tiny_model):
    return tiny_model("bert-mean")


def test_fairness_objective_counts_documents_and_skips_baskets_longer_than_every_document(model, tmp_path, monkeypatch):
    settings = default_fairness_settings(
        target_docs=24, min_segment_tokens=1, max_segment_tokens=60, batch_size=8, chunk_size=8
    )
    obj = FairnessObjective(model, tiny_corpus(topics=12), settings, store=tmp_path / "cache")
    lengths = np.array([d.n_tokens for inst in obj.instances[DEV] for d in inst.documents])
    B = int(np.median(lengths))
    # mean pooling isolates nothing: a document is calibrated iff n_tokens >= B + 1
    expected = float(np.mean(lengths >= B + 1))
    assert 0 < expected < 1
    assert obj.calibrated_share(Calibration(basket_size=B, layers=1.0, strength=1.0), DEV) == pytest.approx(expected)
    too_long = 10 * int(lengths.max())
    used = []
    real = enc.encode_documents

    def spy(m, texts, calibration=STOCK, *a, **k):
        used.append(calibration)
        return real(m, texts, calibration, *a, **k)

    monkeypatch.setattr(enc, "encode_documents", spy)
    space = SearchSpace(basket_sizes=(B, too_long), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=0)
    res = run_search(obj, space, max_drop=1.0)
    assert [t.label for t in res.skipped] == [Calibration(basket_size=too_long, layers=1.0, strength=1.0).label()]
    assert all(c is STOCK or c.basket_size == B for c in used)  # the no-op point encoded nothing
    dev = {t.label: t for t in res.dev_trials()}
    assert dev[Calibration(basket_size=B, layers=1.0, strength=1.0).label()].calibrated_share == pytest.approx(expected)
    if res.chosen is not STOCK:
        test_lengths = np.array([d.n_tokens for inst in obj.instances[TEST] for d in inst.documents])
        assert res.trial(res.chosen, TEST).calibrated_share == pytest.approx(float(np.mean(test_lengths >= B + 1)))
