"""One command-line vocabulary: an option name means one thing, with one help text and one default, in every
command that has it; the few differences are listed here with their reason, so a new one fails this test."""

from __future__ import annotations

import click
import typer

from posfair.cli.app import app

_GROUP = typer.main.get_command(app)
_CTX = click.Context(_GROUP)
COMMANDS = {name: _GROUP.get_command(_CTX, name) for name in _GROUP.list_commands(_CTX)}


def options() -> dict[str, dict[str, click.Option]]:
    """option flag -> {command: the option}."""
    out: dict[str, dict[str, click.Option]] = {}
    for name, cmd in COMMANDS.items():
        for p in cmd.params:
            if p.param_type_name == "option":
                out.setdefault(p.opts[0], {})[name] = p
    return out


#: options whose default (or whether it is required) differs between commands, on purpose: {flag: {command: why}}
DIFFERENT_DEFAULTS = {
    "--out": {
        "encode": "names an output file (.npy / .parquet): required",
        "embed": "names an embedding store: required",
        "estimate-prior": "names the prior's JSON file: required",
    },
    "--corpus": {"encode": "the file of texts to encode: required"},
    "--lang": {
        "embed": "() = every language of the corpus (with --part: the benchmark's own)",
        "audit": "() = en when no --mixed / --language-grid is given (they name their own languages)",
        "retrieval": "one language: the benchmark's queries (None = the benchmark's own)",
        "sweep": "as retrieval",
        "tune": "one language: en",
    },
    "--n": {"audit": "the papers' two instances: 3,4 (the others default to 3)"},
    "--max-seq-length": {"fit": "512: the documents a repair is fitted and judged on reach the position limit"},
    "--max-recall-drop": {"fit": "1 point on a held-out family (tune: 2 points on its own test split)"},
    "--test-family": {"fit": "the family with the fewest sections (tune: none, a share of the topics)"},
    "--baskets": {"tune": "() = the values of --space"},
    "--layer-sets": {"tune": "() = the values of --space"},
    "--strengths": {"tune": "() = the values of --space"},
    "--benchmark": {"tune": "optional: --objective retrieval builds one from --corpus"},
    "--cache": {"encode": "a temporary folder next to the output, removed after success"},
    "--calibration": {"audit": "repeatable: () = stock only", "retrieval": "repeatable: () = stock only"},
    "--ray-address": {"serve": "a server always runs on Ray: its own local instance (embed: not on Ray without it)"},
}
#: options whose help differs between commands, on purpose: {flag: {command: why}}
DIFFERENT_HELP = {
    "--out": {
        "encode": "a file",
        "embed": "a store",
        "estimate-prior": "a file",
        "retrieval": "resumes",
        "sweep": "resumes",
        "tune": "resumes the search",
        "fit": "the repaired model folder",
    },  # fmt: skip
    "--max-seq-length": {"fit": "the documents' limit; the saved folder keeps the model's own"},
    "--max-recall-drop": {"fit": "recall@1 and own-above-foreign on the held-out family"},
    "--test-family": {"fit": "the default: the family with the fewest sections"},
    "--calibration": {"audit": "repeatable: calibrations compared", "retrieval": "repeatable: calibrations compared"},
    "--corpus": {"embed": "also plain text files and benchmark parts", "encode": "a file of texts"},
    "--benchmark": {"tune": "only for --objective retrieval"},
    "--cache": {"encode": "temporary by default"},
    "--lang": {"retrieval": "one language", "sweep": "one language", "tune": "one language"},
    "--docs": {"tune": "says how the tuner splits the sets"},
    "--ray-address": {"serve": "no 'local': without the option the server starts an instance of its own"},
}


def _majority(values: dict[str, object], exceptions: dict[str, str]) -> set:
    return {repr(v) for c, v in values.items() if c not in exceptions}


def test_one_option_name_has_one_default_and_one_help_text():
    problems = []
    for flag, by_command in options().items():
        if len(by_command) < 2 or flag == "--out":  # --out: one rule, checked below
            continue
        defaults = {c: (p.default, p.required, str(p.show_default)) for c, p in by_command.items()}
        if len(_majority(defaults, DIFFERENT_DEFAULTS.get(flag, {}))) > 1:
            problems.append(f"{flag}: defaults {defaults}")
        helps = {c: p.help for c, p in by_command.items()}
        if len(_majority(helps, DIFFERENT_HELP.get(flag, {}))) > 1:
            problems.append(f"{flag}: help texts {helps}")
    assert problems == []
    # the listed differences are real (a stale entry fails too)
    for table in (DIFFERENT_DEFAULTS, DIFFERENT_HELP):
        for flag, commands in table.items():
            assert set(commands) <= set(options()[flag]), flag


def test_calibration_options_describe_a_calibration_and_profile_options_a_profile():
    """--layers / --basket-size / --strength set a calibration (encode, embed, serve); the attention profile's own
    layers and basket are --profile-layers / --profile-basket-size; the grids are --baskets / --layer-sets /
    --strengths."""
    opts = options()
    assert (
        set(opts["--layers"]) == set(opts["--basket-size"]) == set(opts["--strength"]) == {"encode", "embed", "serve"}
    )
    assert set(opts["--profile-layers"]) == set(opts["--profile-basket-size"]) == {"attention"}
    assert set(opts["--layer-sets"]) == set(opts["--baskets"]) == set(opts["--strengths"]) == {"sweep", "tune"}
    assert "--max-docs" not in opts


def test_every_option_says_its_default_and_every_calibration_help_its_variants():
    opts = options()
    silent = [f"{c} {flag}" for flag, by in opts.items() for c, p in by.items()
              if not (p.is_flag or p.required or p.show_default)]  # fmt: skip
    assert silent == []
    for c, p in opts["--calibration"].items():
        assert "VARIANT=VALUE" in p.help and "prior=FILE" in p.help and "VARIANT=VALUE" in (p.metavar or ""), c
    # one batch size and one document count everywhere
    assert {p.default for p in opts["--batch-size"].values()} == {32}
    assert {p.default for p in opts["--docs"].values()} == {144}
    assert "minutes on a CPU" in opts["--docs"]["audit"].help and "--docs 1000" in opts["--docs"]["audit"].help


def test_a_results_folder_defaults_to_posfair_command():
    """--out: a results folder defaults to posfair-<command> (the listed exceptions name a file or a store, or
    keep one folder per benchmark)."""
    from pathlib import Path

    for command, p in options()["--out"].items():
        if command in DIFFERENT_DEFAULTS["--out"]:
            continue
        assert not p.required and p.default == Path("posfair-" + command), command
