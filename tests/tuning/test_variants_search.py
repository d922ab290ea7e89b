"""The tuner with calibration variants: joint search, a Pareto front per variant, per-variant test confirmation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from posfair import Calibration
from posfair.calibration import STOCK
from posfair.calibration.params import PositionalPrior
from posfair.runtime.errors import PosfairInputError
from posfair.tuning import (
    DEV,
    TEST,
    FairnessObjective,
    FunctionObjective,
    SearchSpace,
    default_fairness_settings,
    pareto_front,
    run_search,
)
from posfair.tuning.outputs import fronts_figure, write_outputs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fairness"))
from conftest import tiny_corpus  # noqa: E402

PRIOR = PositionalPrior(values=((2.0, 1.0),))
SPACE = SearchSpace(basket_sizes=(16, 64), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=3, min_step=0.01,
                    variants=("uniform", "prior", "self", "special"), self_shares=(0.5, 1.0), special_shares=("original", 0.1),
                    prior=PRIOR)  # fmt: skip
OFFSET = {"uniform": 0.3, "prior": 0.0, "self": 0.2, "special": 0.25}


def synthetic(cal, split):
    """Lower score is better; each variant has its own offset and optimum strength; the guard falls with strength."""
    if cal is STOCK:
        return {"score": 1.0, "guard": 1.0}
    optimum = {"uniform": 0.6, "prior": 0.8, "self": 0.7, "special": 0.9}[cal.variant]
    s = (cal.strength - optimum) ** 2 + OFFSET[cal.variant] + (0 if cal.basket_size == 16 else 0.1)
    return {"score": s + (0.5 if split == TEST else 0.0), "guard": 1.0 - 0.05 * cal.strength}


def test_every_grid_point_is_tried_as_every_variant():
    grid = SPACE.coarse()
    assert len(grid) == 2 * 2 * (1 + 1 + 2 + 2)
    assert {c.variant for c in grid} == {"uniform", "prior", "self", "special"}
    assert {c.self_share for c in grid if c.variant == "self"} == {0.5, 1.0}
    assert {c.bos_weight for c in grid if c.variant == "special"} == {"original", 0.1}
    assert all(c.prior == PRIOR for c in grid if c.variant == "prior")


def test_combinations_pair_their_parts_values_and_are_named_by_their_parts():
    space = SearchSpace(basket_sizes=(16,), layer_sets=(0.5,), strengths=(1.0,), fine_rounds=0, prior=PRIOR,
                        variants=("prior+special", "self+special", "prior+self+special"),
                        self_shares=(0.5, 1.0), special_shares=("original", 0.1))  # fmt: skip
    grid = space.coarse()
    # prior+special: one per special share; self+special: 2 x 2; prior+self+special: 2 x 2
    assert len(grid) == 2 + 4 + 4 and len({c.key() for c in grid}) == len(grid)
    by = {v: [c for c in grid if c.variant == v] for v in space.variants}
    assert [len(by[v]) for v in space.variants] == [2, 4, 4]
    for c in by["self+special"]:
        assert c.prior is None and c.self_share in (0.5, 1.0) and c.isolate_bos and c.isolate_eos
    assert {(c.self_share, c.bos_weight) for c in by["self+special"]} == {
        (r, w) for r in (0.5, 1.0) for w in ("original", 0.1)
    }
    assert all(c.prior == PRIOR and c.self_share is None and c.special_share is not None for c in by["prior+special"])
    # the name is what Calibration says of itself, built either way round
    base = Calibration(basket_size=16, layers=0.5, strength=1.0)
    assert base.with_special("equal").variant == "special"
    assert Calibration(basket_size=16, self_share=0.5).with_special(0.1).variant == "self+special"
    assert Calibration(basket_size=16, prior=PRIOR, self_share=1.0).variant == "prior+self"
    assert Calibration(basket_size=16, isolate_bos=True, bos_weight=0.1, self_share=1.0).variant == "self"
    with pytest.raises(PosfairInputError, match="variants must be among"):
        SearchSpace(variants=("special+self",))  # parts in their one order only


def test_trailing_policies_are_one_more_grid_dimension_with_a_fine_line_each(tmp_path):
    space = SearchSpace(basket_sizes=(16, 64), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=1,
                        variants=("uniform", "special"), trailings=("basket", "weighted"))  # fmt: skip
    grid = space.coarse()
    assert len(grid) == 2 * 2 * 2 * 2 and {c.trailing for c in grid} == {"basket", "weighted"}
    assert len({c.key() for c in grid}) == len(grid) and all(
        "trailweighted" in c.label() for c in grid if c.trailing == "weighted"
    )

    def smooth(cal, split):  # the weighted policy scores better at every point; the guard falls with strength
        if cal is STOCK:
            return {"score": 1.0, "guard": 1.0}
        return {"score": 0.5 - 0.2 * (cal.trailing == "weighted") + (cal.strength - 0.75) ** 2,
                "guard": 1.0 - 0.01 * cal.strength}  # fmt: skip

    res = run_search(FunctionObjective(smooth), space, max_drop=0.1, results_path=tmp_path / "tune.json")
    assert res.chosen.trailing == "weighted" and res.chosen.strength == 0.75
    assert {c.trailing for c in res.variant_best.values()} == {"weighted"}
    assert json.loads((tmp_path / "tune.json").read_text())["space"]["trailings"] == ["basket", "weighted"]
    assert "trailings" not in SearchSpace(variants=("uniform", "special")).to_dict()
    with pytest.raises(PosfairInputError, match="trailing policies must be among basket, merge, weighted"):
        SearchSpace(trailings=("flat",))


def test_a_combination_is_searched_as_a_variant_of_its_own(tmp_path):
    def combined(cal, split):
        if cal is STOCK:
            return {"score": 1.0, "guard": 1.0}
        best = {"uniform": 0.5, "self+special": 0.2}[cal.variant]
        return {"score": best + (cal.strength - 0.75) ** 2, "guard": 1.0 - 0.01 * cal.strength}

    space = SearchSpace(basket_sizes=(16,), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=1,
                        variants=("uniform", "self+special"), self_shares=(1.0,), special_shares=("original",))  # fmt: skip
    res = run_search(FunctionObjective(combined), space, max_drop=0.1, results_path=tmp_path / "tune.json")
    assert (
        res.chosen.variant == "self+special" and res.chosen.self_share == 1.0 and res.chosen.special_share == "original"
    )
    assert res.chosen.strength == 0.75  # the fine round bisected the combination's own line
    assert set(res.fronts) == {"uniform", "self+special"}
    assert res.variant_best["uniform"].variant == "uniform"
    assert json.loads((tmp_path / "tune.json").read_text())["space"]["variants"] == ["uniform", "self+special"]


def test_joint_search_fronts_and_test_confirmation(tmp_path):
    res = run_search(FunctionObjective(synthetic), SPACE, max_drop=0.1, results_path=tmp_path / "tune.json")
    assert res.chosen.variant == "prior" and res.chosen.basket_size == 16 and abs(res.chosen.strength - 0.8) < 0.02
    dev = res.dev_trials()
    stock = res.trial(STOCK, DEV)
    for v in SPACE.variants:  # each variant's front = brute force over its trials (with stock)
        mine = [t for t in dev if t.variant == v]
        brute = [t for t in [stock, *mine] if not any(
            (o.metrics["score"] <= t.metrics["score"] and o.metrics["guard"] >= t.metrics["guard"])
            and (o.metrics["score"], o.metrics["guard"]) != (t.metrics["score"], t.metrics["guard"]) for o in [stock, *mine])]  # fmt: skip
        assert {t.key for t in res.fronts[v]} == {t.key for t in brute}
        assert res.fronts[v] == pareto_front([stock, *mine], "score", "guard", False)
        # the fine search ran on each variant's best line
        fine = [t for t in mine if t.phase == "fine"]
        assert fine and len({t.line for t in fine}) == 1
        best = res.variant_best[v]
        assert best is not None and best.variant == v
        assert res.trial(best, TEST).metrics["score"] == pytest.approx(synthetic(best, TEST)["score"])
    assert abs(res.variant_best["special"].strength - 0.9) < 0.03
    # test trials: stock, the choice and the other variants' best, evaluated only after the dev search
    test = [t for t in res.trials if t.split == TEST]
    assert {t.key for t in test} == {"stock"} | {c.key() for c in res.variant_best.values()}
    first_test = next(i for i, t in enumerate(res.trials) if t.split == TEST)
    assert all(t.split == DEV for t in res.trials[:first_test]) and all(
        t.split == TEST for t in res.trials[first_test:]
    )
    saved = json.loads((tmp_path / "tune.json").read_text())
    assert set(saved["fronts"]) == set(SPACE.variants) and saved["space"]["variants"] == list(SPACE.variants)
    paths = write_outputs(res, tmp_path / "out")
    assert (
        paths["fronts"] == tmp_path / "out" / "fronts.png"
        and paths["fronts"].is_file()
        and "table:variants.md" in paths
    )
    # the fronts figure draws each variant's front: its line joins the front's settings (stock starred apart)
    lines = {line.get_label(): line for line in fronts_figure(res).axes[0].get_lines()}
    for v in SPACE.variants:
        front = sorted((t.metrics["score"], t.metrics["guard"]) for t in res.fronts[v] if t.key != "stock")
        assert front, v
        np.testing.assert_allclose(lines[f"{v} front"].get_xydata(), front, err_msg=v)
    table = (tmp_path / "out" / "tables" / "variants.md").read_text()
    for c in res.variant_best.values():
        assert c.label() in table
    only_choice = (tmp_path / "out" / "tables" / "test.md").read_text()
    assert res.chosen.label() in only_choice and res.variant_best["special"].label() not in only_choice
    frame = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert set(frame["variant"]) == {"stock", *SPACE.variants}


def test_variant_space_validation():
    with pytest.raises(PosfairInputError, match="variants must be among"):
        SearchSpace(variants=("uniform", "magic"))
    with pytest.raises(PosfairInputError, match="self_share"):
        SearchSpace(variants=("self",), self_shares=(1.5,))
    with pytest.raises(PosfairInputError, match="bos_weight"):
        SearchSpace(variants=("special",), special_shares=(1.0,))
    with pytest.raises(PosfairInputError, match="cannot estimate a positional prior"):
        run_search(FunctionObjective(synthetic), SearchSpace(variants=("prior",)), max_drop=0.1)
    assert "variants" not in SearchSpace().to_dict()  # the default space keeps its stored form (resumable runs)


SETTINGS = default_fairness_settings(
    target_docs=24, min_segment_tokens=1, max_segment_tokens=60, batch_size=8, chunk_size=8
)


def test_fairness_objective_estimates_the_prior_on_the_dev_split(tiny_model, tmp_path):
    model = tiny_model("bert-mean")
    obj = FairnessObjective(model, tiny_corpus(topics=12), SETTINGS, store=tmp_path / "cache")
    space = SearchSpace(
        basket_sizes=(4,), layer_sets=(1.0,), strengths=(1.0,), fine_rounds=0, variants=("uniform", "prior")
    )
    res = run_search(obj, space, max_drop=0.5)
    est = obj.prior_estimate
    dev_docs = [d.text for inst in obj.instances[DEV] for d in inst.documents]
    assert est.documents + est.skipped == len(dev_docs)
    assert est.calibration.prior.layers == tuple(range(model.num_layers))
    prior_trials = [t for t in res.dev_trials() if t.variant == "prior"]
    assert prior_trials and all(t.calibration.prior == est.calibration.prior for t in prior_trials)
    assert (
        prior_trials[0].metrics["spread"]
        != res.trial(Calibration(basket_size=4, layers=1.0, strength=1.0), DEV).metrics["spread"]
    )


def test_cli_tune_with_variants_on_the_retrieval_objective(tiny_model, tiny_model_path, tmp_path):
    from typer.testing import CliRunner

    from posfair.cli import app
    from posfair.tuning.tuner import build_corpus_benchmark

    model = tiny_model("bert-mean")
    build_corpus_benchmark(model, tiny_corpus(topics=24), tmp_path / "bench")
    path, _ = tiny_model_path("bert-mean")
    out = tmp_path / "cli"
    r = CliRunner().invoke(app, ["tune", "--model", str(path), "--objective", "retrieval", "--benchmark", str(tmp_path / "bench"),
                                 "--baskets", "4", "--layer-sets", "1.0", "--strengths", "1.0", "--fine-rounds", "0",
                                 "--variants", "uniform,prior,self,special", "--self-shares", "0.5", "--special-shares", "original,0.05",
                                 "--max-ndcg-drop", "100", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    saved = json.loads((out / "tune.json").read_text())
    dev = [Calibration.from_dict(t["calibration"]) for t in saved["trials"] if t["split"] == DEV and t["calibration"]]
    assert sorted(c.variant for c in dev) == ["prior", "self", "special", "special", "uniform"]
    prior = next(c for c in dev if c.variant == "prior").prior
    assert prior.layers == tuple(range(model.num_layers)) and prior.bins == 20
    assert {c.self_share for c in dev} == {None, 0.5} and {c.bos_weight for c in dev if c.variant == "special"} == {
        "original",
        0.05,
    }
    assert set(saved["fronts"]) == {"uniform", "prior", "self", "special"}
    assert (out / "fronts.png").is_file()
    # the variants table holds each variant's best dev setting, as tune.json names it, under that variant
    table = pd.read_csv(out / "tables" / "variants.csv")
    best = {v: label for v, label in saved["variant_best"].items() if label}
    assert best and all(((table["variant"] == v) & (table["setting"] == label)).any() for v, label in best.items())
