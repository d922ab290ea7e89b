"""Issue 40 items 4, 8, 9: one spelling per meaning (former names still work, hidden), the defaults a first-time
reader expects, and refusals that name the way out."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tests.cli.test_vocabulary import COMMANDS, options
from typer.testing import CliRunner

from posfair.cli import aliases
from posfair.cli.app import app


def _help(command: str) -> str:
    return CliRunner().invoke(app, [command, "--help"], terminal_width=200).output


@pytest.mark.parametrize("command", sorted(aliases.ALIASES))
def test_former_names_are_hidden_and_rewritten(command):
    text = _help(command)
    for former, current in aliases.ALIASES[command].items():
        assert former not in text.replace(current + ",", "").split(), (command, former)
        assert aliases.rewrite(["--debug", command, former, "x", f"{former}=y"]) == [
            "--debug", command, current, "x", f"{current}=y"
        ]  # fmt: skip
    assert aliases.rewrite(["encode", "--langs", "en"]) == ["encode", "--langs", "en"]  # only the commands' own


def test_languages_are_one_option_everywhere():
    """--lang is the one spelling (a list where the command takes several); no command has both."""
    opts = options()
    assert "--langs" not in opts
    assert set(opts["--lang"]) == {
        "audit", "attention", "estimate-prior", "build-benchmark", "embed", "retrieval", "sweep", "tune"
    }  # fmt: skip
    for command, p in opts["--lang"].items():
        assert "LANG" in (p.metavar or ""), command


def test_strength_is_strength_and_docs_help_names_the_tuner_only_in_tune():
    for name, cmd in COMMANDS.items():
        for p in cmd.params:
            assert "ALPHA" not in (p.metavar or ""), (name, p.opts)
    for command, p in options()["--docs"].items():
        assert ("tuner" in p.help) == (command == "tune"), command


def test_audit_without_languages_audits_english(monkeypatch, tmp_path):
    """Bare `posfair audit` runs English documents, as attention and estimate-prior do (it refused before)."""
    import posfair.cli.runs as audit_module
    from posfair.cli import checks

    seen = {}
    monkeypatch.setattr(checks, "load_model", lambda *a, **k: SimpleNamespace(display_name="m"))
    monkeypatch.setattr(checks, "check_calibrations", lambda *a, **k: None)
    monkeypatch.setattr(audit_module, "run_audit", lambda model, data, settings, *rest: seen.update(s=settings))
    r = CliRunner().invoke(app, ["audit", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert [c.key for c in seen["s"].configs] == ["en"]
    r = CliRunner().invoke(app, ["audit", "--mixed", "de:en", "-o", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert [c.key for c in seen["s"].configs] == ["de-en"]  # a configuration given: no English added


def test_embed_part_takes_one_language(tmp_path):
    r = CliRunner().invoke(app, ["embed", "-o", str(tmp_path / "s"), "-c", "bench", "--part", "queries", "--langs",
                                 "en,de"])  # fmt: skip
    assert r.exit_code == 2 and "--lang en,de: with --part, one language" in r.output


def test_the_calibration_refusal_lists_every_variant(tmp_path):
    r = CliRunner().invoke(app, ["encode", "-c", str(tmp_path / "x.txt"), "-o", str(tmp_path / "y.npy"),
                                 "--calibration", "16"])  # fmt: skip
    assert r.exit_code == 2
    for variant in ("prior=FILE", "self=RHO", "special=SHARE", "trailing=POLICY", "schedule=SCHEDULE"):
        assert variant in r.output, variant


def test_tunes_default_grid_leaves_out_baskets_the_token_limit_cannot_fill():
    from posfair.cli.tune import fit_space
    from posfair.tuning import SearchSpace

    space, dropped = fit_space(SearchSpace(), 256)  # the bundled model's limit
    assert dropped == [256] and space.basket_sizes == (16, 64)
    assert fit_space(SearchSpace(), 512) == (SearchSpace(), [])
    paper, dropped = fit_space(SearchSpace.paper(), 256)
    assert dropped == [256, 512] and paper.basket_sizes == (128,)
    assert fit_space(SearchSpace(basket_sizes=(512,)), 256)[1] == []  # none would remain: kept (and skipped per run)


def test_a_retrieval_folder_of_an_older_posfair_resumes_from_its_sweep_json(tmp_path):
    from posfair.retrieval import resumable_sweep as sweep
    from posfair.runtime.errors import PosfairInputError

    key = {k: f"v-{k}" for k in sweep._SWEEP_KEY} | {"benchmark": {"name": "b", "fingerprint": "f"}}
    (tmp_path / "sweep.json").write_text(json.dumps(key | {"settings": ["stock"]}))
    assert sweep.SWEEP_FILE == "retrieval.json"
    assert sweep._check_resumable(tmp_path, key, ["B16-Llast1-a1"]) == ["stock", "B16-Llast1-a1"]
    with pytest.raises(PosfairInputError, match="a different model"):
        sweep._check_resumable(tmp_path, key | {"model": "other"}, ["stock"])


def test_the_demo_names_the_model_before_each_parts_progress(monkeypatch, tmp_path, capsys):
    import posfair.cli.runs as audit_module
    from posfair.cli import checks, demo

    monkeypatch.setattr(
        checks, "load_model", lambda options, **k: SimpleNamespace(display_name=f"model of {options.model}")
    )
    monkeypatch.setattr(audit_module, "run_audit", lambda *a, **k: (None, [], 0.0))
    monkeypatch.setattr(demo, "_write_index", lambda out, parts: None)
    monkeypatch.setattr(demo.importlib.util, "find_spec", lambda name: object())
    demo._run_parts(tmp_path, 12, None, None)
    out = capsys.readouterr().out
    for folder, model_name, *_ in demo.DEMO_PARTS:
        assert f"{folder} part: model of {model_name}" in out
