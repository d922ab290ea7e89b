"""What `posfair tune` says at the terminal (a few plain lines, not the Markdown summary), and a setting that fails
its own test-split checks is not saved unless asked (issue 40 items 1 and 2)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from posfair.calibration import STOCK
from posfair.cli import app
from posfair.tuning import SearchSpace, run_search, tune
from posfair.tuning import verdicts as trials_mod
from posfair.tuning.outputs import summary_text
from posfair.tuning.verdicts import ConstraintWarning, ScoreEffect, SlopeInterval

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tests.tuning.test_constraint_check import UnitObjective

SPACE = SearchSpace(basket_sizes=(16, 64), layer_sets=(0.5,), strengths=(0.5, 1.0), fine_rounds=0)


def test_a_setting_that_breaks_the_constraint_on_test_is_not_saved_and_the_summary_leads_with_it(tmp_path):
    out, saved = tmp_path / "out", tmp_path / "saved"
    with pytest.warns(ConstraintWarning, match="tuned model not saved"):
        res = tune(None, objective=UnitObjective(test_drop=0.10), space=SPACE, max_drop=0.02, out_dir=out,
                   save_model=saved)  # fmt: skip
    assert not saved.exists() and res.saved_model is None
    # recall fell by 0.10 on every test unit: -10.0 points, interval [-10.0, -10.0], limit -2.0
    assert res.failures() == [
        "the constraint is broken: recall@n changed by -10.0 points [95 % interval -10.0, -10.0], the limit is -2.0"
    ]
    assert res.save_refused.startswith(f"{res.chosen_label} fails on the held-out test split")
    md = (out / "summary.md").read_text()
    assert md.index("FAILS on the held-out test split") < md.index("Pareto front")
    assert "NOT saved" in md
    text = summary_text(res, out)
    lines = text.splitlines()
    assert lines[0].startswith(f"chosen on the dev split: {res.chosen_label}") and lines[1].startswith("FAILS")
    assert "|" not in text and "**" not in text and "#" not in text and len(lines) <= 10
    assert f"files: {out / 'summary.md'}" in text
    assert text.count("-10.0 points") == 1 and "constraint:" not in text  # the broken constraint is said once
    assert "saved" not in text  # the refusal is the command's error line
    assert (out / "trials.log").read_text().splitlines()[0].split()[:3] == ["dev", "stock", "stock"]


def test_save_anyway_saves_a_failing_setting_and_a_passing_one_is_saved_without_asking(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr("posfair.tuning.tuner.save_tuned_model", lambda m, cal, path: calls.append((cal, path)))
    model = SimpleNamespace(max_seq_length=128)  # the objective never encodes; only the save reads the model
    res = tune(model, objective=UnitObjective(test_drop=0.10), space=SPACE, max_drop=0.02, out_dir=tmp_path / "a",
               save_model=tmp_path / "m1", save_anyway=True)  # fmt: skip
    assert calls == [(res.chosen, tmp_path / "m1")] and res.save_refused is None
    assert "saved to" in summary_text(res) and "although it fails" in summary_text(res)
    ok = tune(model, objective=UnitObjective(test_drop=0.0), space=SPACE, max_drop=0.02, save_model=tmp_path / "m2")
    assert ok.failures() == [] and calls[-1] == (ok.chosen, tmp_path / "m2") and ok.saved_model == str(tmp_path / "m2")


def test_a_profile_reversed_beyond_noise_is_a_failure_and_its_spread_is_not_called_a_reduction(monkeypatch):
    res = run_search(UnitObjective(test_drop=0.0), SPACE, max_drop=0.02)
    assert res.chosen is not STOCK and res.failures() == []
    reversed_ = ScoreEffect(0.64, 0.48, 0.73, 5, SlopeInterval(-0.045, 0.0067, 0.0003, 0.0101, "reversed"))
    monkeypatch.setattr(trials_mod, "score_effect_interval", lambda obj, cal, split: reversed_)
    obj = UnitObjective(test_drop=0.0)
    obj.effect, obj.format_effect = "removed", lambda v: f"{100 * v:.0f}%"
    effect = trials_mod.test_score_effect(obj, res.trials, res.chosen, res.score)
    assert "the interval supports" not in effect.verdict and "not a reduction of bias" in effect.verdict
    res.test_effect = effect
    assert res.failures() == [
        "the σ profile is reversed beyond noise: slope on position +0.0067 [95 % interval +0.0003, +0.0101], "
        "stock's -0.0450 (bias the other way)"
    ]


def test_the_command_prints_a_short_plain_summary_and_refuses_to_save_a_failing_setting(tiny_model_path, tmp_path,
                                                                                         monkeypatch):  # fmt: skip
    import posfair.tuning.tuner as tuner

    real = tuner.tune
    monkeypatch.setattr(tuner, "tune", lambda model, df, **kw: real(
        model, objective=UnitObjective(test_drop=0.10), space=SPACE, max_drop=0.02, out_dir=kw["out_dir"],
        save_model=kw["save_model"], save_anyway=kw["save_anyway"], log=kw["log"]))  # fmt: skip
    path, _ = tiny_model_path("bert-mean")
    out, saved = tmp_path / "out", tmp_path / "saved"
    r = CliRunner().invoke(app, ["tune", "--model", str(path), "--out", str(out), "--save-model", str(saved)])
    assert r.exit_code == 3, r.output
    assert not saved.exists()
    assert "# posfair tune" not in r.output and "|" not in r.output and "**" not in r.output
    # the verdict once: the failure in one line, "not saved" in the error line, no warning repeating either
    said = " ".join(r.output.split())
    assert said.count("FAILS on the held-out test split") == 1 and said.count("-10.0 points") == 1
    assert said.lower().count("not saved") == 1 and "warning:" not in said
    assert r.stderr.startswith(f"error: tuned model not saved to {saved}") and "--save-model-anyway" in r.stderr
    # the trials are in the trial log, printed only with --verbose
    trials = (out / "trials.log").read_text().splitlines()
    assert len(trials) >= 5 and trials[0] not in r.output and len(r.stdout.splitlines()) <= 6
    again = CliRunner().invoke(app, ["tune", "--model", str(path), "--out", str(out), "--verbose"])
    assert again.exit_code == 0, again.output
    assert all(line.strip() in again.stdout for line in (out / "trials.log").read_text().splitlines())
    assert "Pareto front" in (out / "summary.md").read_text()
    bad = CliRunner().invoke(app, ["tune", "--model", str(path), "--save-model-anyway"])
    assert bad.exit_code == 2 and "--save-model-anyway" in bad.output


def test_the_test_split_check_speaks_in_points_as_max_recall_drop_does():
    """--max-recall-drop 2 is in points; the verdict says the change and the limit in points too (not 0-1)."""
    with pytest.warns(ConstraintWarning):
        res = run_search(UnitObjective(test_drop=0.10), SPACE, max_drop=0.02)
    assert "recall changed by -10.0 points [95 % interval -10.0, -10.0 over 40 segment sets], limit -2.0" in (
        res.test_check.verdict
    )
