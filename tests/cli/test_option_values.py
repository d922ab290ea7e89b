"""A command's options travel as one typed value (issue 50, item 5): built once by the command, checked in one
place, passed down whole; ``--max-seq-length`` reaches the model load by name from every command; the token
budget has one name (``--max-batch-tokens``) in ``embed`` and ``serve``, the former ``--max-tokens`` kept, hidden,
with a one-line warning."""

from __future__ import annotations

import dataclasses
import inspect
import re
import socket

import pytest
from typer.testing import CliRunner

from posfair.cli import app
from posfair.runtime.errors import PosfairInputError

WIDE = {"COLUMNS": "200"}


class Loaded(Exception):
    """Raised in place of loading the model: the command got that far, with what it passed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def loads(monkeypatch):
    """The keywords every ``posfair.load_model`` call of a command gets (the load itself is replaced by Loaded)."""
    import posfair.model

    seen: list[dict] = []

    def load(source, **kwargs):
        seen.append({"source": source, **kwargs})
        raise Loaded

    monkeypatch.setattr(posfair.model, "load_model", load)
    return seen


def test_benchmark_options_are_one_frozen_value_refused_when_made(tmp_path):
    from posfair.cli.checks import ModelOptions
    from posfair.cli.runs import BenchmarkOptions, run_benchmark

    model = ModelOptions("bundled", max_seq_length=128)
    options = BenchmarkOptions(benchmark="b", model=model, out=tmp_path, late=["max"], domains=["faq"])
    assert options.late == ("max",) and options.domains == ("faq",)  # lists from the parser, frozen as tuples
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.top_k = 5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.model.max_seq_length = 64  # type: ignore[misc]
    assert options.model.max_seq_length == 128 and options.model.source is None
    assert BenchmarkOptions(benchmark="b", model=model, out=tmp_path, query_prompt="q:\\n").prompt == "q:\n"
    assert BenchmarkOptions(benchmark="b", model=model, out=tmp_path, query_prompt="none").prompt is None
    with pytest.raises(PosfairInputError, match="nothing to evaluate"):
        BenchmarkOptions(benchmark="b", model=model, out=tmp_path, stock=False)
    with pytest.raises(PosfairInputError, match="--late-chunks 64: applies only with --late"):
        BenchmarkOptions(benchmark="b", model=model, out=tmp_path, late_chunks=64)
    with pytest.raises(PosfairInputError, match="--query-prompt"):
        BenchmarkOptions(benchmark="b", model=model, out=tmp_path, query_prompt="\\x")
    assert list(inspect.signature(run_benchmark).parameters) == ["options"]


def test_the_options_are_checked_once_and_the_model_loaded_with_them(tmp_path, monkeypatch, loads):
    """``retrieval``: the model's source and the folders are checked once, before the benchmark is read; the load
    gets the options' fields by name."""
    import posfair.cli.checks as checks
    import posfair.retrieval.benchmarks as benchmarks

    counted = {"model_source": 0, "output_folder": 0}
    for name in counted:
        real = getattr(checks, name)

        def counting(*a, _real=real, _name=name, **k):
            counted[_name] += 1
            return _real(*a, **k)

        monkeypatch.setattr(checks, name, counting)
    monkeypatch.setattr(benchmarks, "load_benchmark", lambda *a, **k: pytest.fail("read before the checks"))
    out = tmp_path / "afile"
    out.write_text("not a folder")
    r = CliRunner().invoke(app, ["retrieval", "-b", str(tmp_path), "-o", str(out)], env=WIDE)
    assert r.exit_code == 2 and f"--out {out}: is an existing file" in r.stderr, r.output
    assert counted == {"model_source": 0, "output_folder": 1} and not loads

    read = []
    monkeypatch.setattr(benchmarks, "load_benchmark", lambda *a, **k: read.append(a) or object())
    monkeypatch.setattr("posfair.cli.runs.say_benchmark_size", lambda bench: None)
    argv = ["retrieval", "-b", str(tmp_path), "-o", str(tmp_path / "out"), "--max-seq-length", "77"]
    CliRunner().invoke(app, [*argv, "--device", "cpu", "-m", "bundled"], env=WIDE)
    assert counted == {"model_source": 1, "output_folder": 2} and read == [(str(tmp_path),)]
    assert loads[-1] == {
        "source": None,
        "max_seq_length": 77,
        "pooling": None,
        "trust_remote_code": False,
        "device": "cpu",
    }


#: every command that loads the model and takes --max-seq-length: its command line ({t}: the test's folder)
MAX_SEQ_LENGTH_COMMANDS = {
    "encode": "encode -i {t}/in.txt -o {t}/o.npy",
    "embed": "embed -o {t}/store",
    "serve": "serve --port {port}",
    "retrieval": "retrieval -b {t} -o {t}/out",
    "sweep": "sweep -b {t} -o {t}/out",
    "audit": "audit -o {t}/out",
    "tune": "tune -o {t}/out",
    "attention": "attention -o {t}/out",
    "estimate-prior": "estimate-prior -o {t}/prior.json",
    "build-benchmark": "build-benchmark -o {t}/bench --lang en",
}


def test_every_command_with_the_option_lists_it_here():
    from posfair.cli.app import app as typer_app

    takes = set()
    for command in typer_app.registered_commands:
        if "max_seq_length" in inspect.signature(command.callback).parameters:
            takes.add(command.name)
    assert takes - {"fit"} == set(MAX_SEQ_LENGTH_COMMANDS)  # fit loads through the repair code (its own test)


@pytest.mark.parametrize("command", sorted(MAX_SEQ_LENGTH_COMMANDS))
def test_max_seq_length_reaches_the_model_load(command, tmp_path, monkeypatch, loads):
    """The trail of ``--max-seq-length`` from the option to ``posfair.load_model``, by name, in every command."""
    import posfair.retrieval.benchmarks as benchmarks

    monkeypatch.setattr(benchmarks, "load_benchmark", lambda *a, **k: object())
    monkeypatch.setattr("posfair.cli.runs.say_benchmark_size", lambda bench: None)
    if command == "serve":
        import posfair.serve.runner as runner
        from posfair.serve.cluster import RAY_LOCAL_ONLY_ENV

        monkeypatch.setattr(runner, "serve_model", lambda *a, **k: pytest.fail("served without loading"))
        monkeypatch.delenv(RAY_LOCAL_ONLY_ENV, raising=False)
    (tmp_path / "in.txt").write_text("a text\nanother text\n")
    line = MAX_SEQ_LENGTH_COMMANDS[command].format(t=tmp_path, port=free_port())
    r = CliRunner().invoke(app, [*line.split(), "--max-seq-length", "77"], env=WIDE)
    assert loads, r.output
    assert loads[-1]["max_seq_length"] == 77, loads[-1]


def test_serve_starts_with_typed_frozen_settings(tiny_model_path, monkeypatch):
    """``posfair serve``: the options the server starts with are the application's typed arguments (AppArgs) in
    a frozen ServerSettings, not a dict; the token budget reaches the replicas' spec under its one name."""
    from pydantic import ValidationError

    import posfair.serve.runner as runner
    from posfair.serve.application import AppArgs, encoder_settings
    from posfair.serve.cluster import RAY_LOCAL_ONLY_ENV

    seen = []
    monkeypatch.setattr(runner, "serve_model", lambda settings, *a, **k: seen.append(settings))
    monkeypatch.delenv(RAY_LOCAL_ONLY_ENV, raising=False)
    path, pooling = tiny_model_path("bert")
    port = free_port()
    argv = ["serve", "-m", str(path), "--pooling", pooling, "--port", str(port), "--max-seq-length", "64"]
    r = CliRunner().invoke(app, [*argv, "--max-batch-tokens", "512", "--replicas", "2", "--truncate"], env=WIDE)
    assert r.exit_code == 0, r.output
    settings = seen[-1]
    assert isinstance(settings, runner.ServerSettings) and isinstance(settings.args, AppArgs)
    assert (settings.port, settings.args.replicas, settings.args.truncate) == (port, 2, True)
    assert (settings.args.model, settings.args.name, settings.args.max_seq_length) == (str(path), str(path), 64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]
    with pytest.raises(ValidationError):
        settings.args.max_batch_tokens = 1  # type: ignore[misc]
    init, _ = encoder_settings(settings.args, {"CPU": 2.0})
    assert init["spec"]["max_batch_tokens"] == 512 and init["spec"]["max_seq_length"] == 64
    assert "starting:" in r.output and "64 tokens" in r.output


@pytest.fixture
def specs(monkeypatch, loads):
    """The EmbedSpec ``posfair embed`` builds (the model load stops the command right after)."""
    import posfair.distributed as distributed

    seen = []

    class Recorded(distributed.EmbedSpec):
        def __post_init__(self) -> None:
            super().__post_init__()
            seen.append(self)

    monkeypatch.setattr(distributed, "EmbedSpec", Recorded)
    return seen


def test_embed_and_serve_name_the_token_budget_alike(tmp_path, specs):
    r = CliRunner().invoke(app, ["embed", "-o", str(tmp_path / "s"), "--max-batch-tokens", "256"], env=WIDE)
    assert specs[-1].max_batch_tokens == 256 and "deprecated" not in r.stderr, r.output
    for command in ("embed", "serve"):
        help_text = CliRunner().invoke(app, [command, "--help"], env=WIDE).output
        assert "--max-batch-tokens" in help_text and "--max-tokens " not in help_text, help_text


@pytest.mark.parametrize("spelling", [["--max-tokens", "300"], ["--max-tokens=300"]])
def test_the_former_name_still_runs_and_says_it_is_deprecated(tmp_path, specs, spelling):
    r = CliRunner().invoke(app, ["embed", "-o", str(tmp_path / "s"), *spelling], env={"COLUMNS": "80"})
    assert specs[-1].max_batch_tokens == 300, r.output
    first = r.stderr.splitlines()[0]
    assert first == "warning: --max-tokens is deprecated: use --max-batch-tokens (same meaning)"
    assert len(first) <= 80 and r.stderr.count("deprecated") == 1


def _pipelines():
    """(options class, the function the command passes them to, a value, the same value's refused variants)."""
    from pathlib import Path

    from posfair.cli.attention import AttentionOptions, attention_run
    from posfair.cli.audit import AuditOptions, audit_run
    from posfair.cli.checks import ModelOptions
    from posfair.cli.encode import EncodeOptions, encode_run
    from posfair.cli.tune import TuneOptions, tune_run

    model, out = ModelOptions("bundled", max_seq_length=128), Path("out")
    return {
        "audit": (
            AuditOptions,
            audit_run,
            dict(out=out, model=model, n=[3, 5], langs=["en", "de"]),
            {
                "--bootstrap-draws applies only to --inference wild": dict(bootstrap_draws=199),
                "a language grid needs at least 2 languages": dict(language_grid=["en"]),
                "--min-segment-tokens 90 is above --max-segment-tokens 30": dict(min_tokens=90, max_tokens=30),
                "--family-field src: applies only with --by-family": dict(family_field="src"),
            },
        ),
        "tune": (
            TuneOptions,
            tune_run,
            dict(out=out, model=model, baskets=[64, 128], n=[3]),
            {
                "--benchmark b applies only to --objective retrieval": dict(benchmark="b"),
                "--save-model-anyway: applies only with --save-model": dict(save_model_anyway=True),
                "--test-family f: applies only to --objective fairness": dict(objective="retrieval", test_family="f"),
            },
        ),
        "attention": (AttentionOptions, attention_run, dict(out=out, model=model, n=[3, 4], langs=["en"]), {}),
        "encode": (
            EncodeOptions,
            encode_run,
            dict(input=Path("in.jsonl"), out=Path("o.parquet"), model=model, calibration=None, id_field="id"),
            {
                "ids go into a .parquet output": dict(out=Path("o.npy")),
                "a .txt input": dict(input=Path("in.txt")),
            },
        ),
    }


@pytest.mark.parametrize("command", ["audit", "tune", "attention", "encode"])
def test_each_pipelines_options_are_one_frozen_value_refused_when_made(command):
    """audit, tune, attention and encode: one frozen options value each (lists from the parser frozen as tuples),
    a combination it refuses refused when the value is made, and the run takes that one value."""
    cls, run, given, refused = _pipelines()[command]
    options = cls(**given)
    assert all(isinstance(getattr(options, k), tuple) for k, v in given.items() if isinstance(v, list))
    field = next(f.name for f in dataclasses.fields(cls) if f.name not in ("out", "model"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(options, field, getattr(options, field))
    for message, change in refused.items():
        with pytest.raises(PosfairInputError, match=re.escape(message)):
            cls(**{**given, **change})
    assert list(inspect.signature(run).parameters) == ["options"]


#: per command a line (its folder: {t}) and what its options value must then hold
WHOLE = {
    "audit": ("audit -o {t}/out --seed 7 --n 3,5 --docs 40 --no-control", dict(seed=7, n=(3, 5), docs=40, control=False)),
    "tune": ("tune -o {t}/out --seed 7 --baskets 64,128 --score max-beta", dict(seed=7, baskets=(64, 128), score="max-beta")),
    "attention": ("attention -o {t}/out --seed 7 --langs en,de --bins 10", dict(seed=7, langs=("en", "de"), bins=10)),
    "encode": ("encode -i {t}/in.txt -o {t}/o.npy --batch-size 7 --normalize", dict(batch_size=7, normalize=True)),
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(WHOLE))
def test_each_command_passes_its_options_down_whole(command, tmp_path, monkeypatch):
    """The command builds its options value once and hands the pipeline that one value, every option in it."""
    import posfair.cli.attention
    import posfair.cli.audit
    import posfair.cli.encode
    import posfair.cli.tune

    module = {"audit": posfair.cli.audit, "tune": posfair.cli.tune, "attention": posfair.cli.attention,
              "encode": posfair.cli.encode}[command]  # fmt: skip
    cls, run, _, _ = _pipelines()[command]
    seen = []
    monkeypatch.setattr(module, run.__name__, lambda *args, **kw: seen.append((args, kw)))
    line, expected = WHOLE[command]
    r = CliRunner().invoke(app, [*line.format(t=tmp_path).split(), "--max-seq-length", "77"], env=WIDE)
    assert r.exit_code == 0, r.output
    ((args, kw),) = seen
    assert kw == {} and len(args) == 1 and type(args[0]) is cls
    assert {k: getattr(args[0], k) for k in expected} == expected and args[0].model.max_seq_length == 77


@pytest.mark.parametrize(
    "line, message",
    [
        ("audit -o {t}/out --family-field src", "--family-field src: applies only with --by-family"),
        ("tune -o {t}/out --save-model-anyway", "--save-model-anyway: applies only with --save-model"),
        ("encode -i {t}/in.txt -o {t}/o.npy --id-field id", "ids go into a .parquet output"),
    ],
)
def test_a_refused_combination_stops_the_command_before_any_work(line, message, tmp_path, monkeypatch, loads):
    """A combination the options value refuses ends the command before a folder is checked or the model loaded."""
    import posfair.cli.checks as checks

    monkeypatch.setattr(checks, "output_folder", lambda *a, **k: pytest.fail("a folder checked after a refusal"))
    monkeypatch.setattr(checks, "output_file", lambda *a, **k: pytest.fail("a file checked after a refusal"))
    r = CliRunner().invoke(app, line.format(t=tmp_path).split(), env=WIDE)
    assert r.exit_code == 2 and message in " ".join(r.stderr.split()), r.output
    assert not loads and not list(tmp_path.iterdir())


def test_the_inference_options_reach_the_audit_as_one_typed_value():
    """``--inference`` and the bootstrap options become one checked Inference (not a dict of keywords), and the
    audit's settings carry exactly it, for ``audit`` and ``demo`` alike."""
    from posfair.cli.checks import inference_choice
    from posfair.fairness.experiment import AuditSettings
    from posfair.stats.inference import Inference

    spec = inference_choice("wild", 199, "rademacher", 7, "set")
    assert spec == Inference(method="wild", draws=199, weights="rademacher", seed=7, clusters="set")
    settings = AuditSettings(configs=("en",)).with_inference(spec)
    assert settings.inference_spec == spec
    assert (settings.bootstrap_draws, settings.bootstrap_seed, settings.clusters) == (199, 7, "set")
    assert inference_choice("cluster", None, None, None) == Inference()  # the defaults live with the OLS code
