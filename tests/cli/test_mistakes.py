"""The table of user mistakes: each exits 2 with one line ``error: ...`` naming the option, file or value.

Every case runs in process through the application's error boundary
(``posfair.cli.error_boundary.PosfairGroup.main``, what the ``posfair`` script runs).
Mistakes are caught before any work: only the few that depend on the model
(its layers, its position limit) load it, and they use the bundled model.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from posfair.cli import app, main
from posfair.runtime.errors import PosfairInputError

# (id, command line ({t} = the test's folder), a fragment the error line must contain, environment)
MISTAKES = [
    # encode
    ("encode-no-input", "encode -o {t}/o.npy", "missing option '--corpus'", None),
    ("encode-missing-input", "encode -i {t}/missing.txt -o {t}/o.npy", "{t}/missing.txt does not exist", None),
    ("encode-not-utf8", "encode -i {t}/latin1.txt -o {t}/o.npy", "{t}/latin1.txt: line 1 is not UTF-8 text", None),
    ("encode-empty-input", "encode -i {t}/empty.txt -o {t}/o.npy", "{t}/empty.txt: no texts to embed", None),
    ("encode-input-missing-field", "encode -i {t}/records.jsonl -o {t}/o.npy", "line 1 has no 'text' field", None),
    ("encode-out-type", "encode -i {t}/in.txt -o {t}/o.csv", "--out {t}/o.csv: unsupported output type '.csv'", None),
    ("encode-out-under-a-file", "encode -i {t}/in.txt -o {t}/afile/o.npy", "{t}/afile is a file, not a folder", None),
    (
        "encode-cache-is-a-file",
        "encode -i {t}/in.txt -o {t}/o.npy --cache {t}/afile",
        "--cache {t}/afile: is an existing file",
        None,
    ),
    (
        "encode-calibration-foo",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration foo",
        "--calibration foo: calibration spec must be",
        None,
    ),
    (
        "encode-calibration-strength",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 128,0.5,1.5",
        "--calibration 128,0.5,1.5: strength",
        None,
    ),
    (
        "encode-strength-1.5",
        "encode -i {t}/in.txt -o {t}/o.npy --strength 1.5",
        "--strength 1.5: must be a number in [0, 1]",
        None,
    ),
    ("encode-basket-0", "encode -i {t}/in.txt -o {t}/o.npy --basket-size 0", "--basket-size 0: must be >= 1", None),
    (
        "encode-calibration-basket-0",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 0,0.5,0.5",
        "--calibration 0,0.5,0.5: basket_size",
        None,
    ),
    (
        "encode-layers-word",
        "encode -i {t}/in.txt -o {t}/o.npy --layers abc",
        "--layers abc: layers must be an int",
        None,
    ),
    ("encode-chunk-size-0", "encode -i {t}/in.txt -o {t}/o.npy --chunk-size 0", "--chunk-size 0: must be >= 1", None),
    ("encode-batch-size-0", "encode -i {t}/in.txt -o {t}/o.npy --batch-size 0", "--batch-size 0: must be >= 1", None),
    (
        "encode-batch-size-word",
        "encode -i {t}/in.txt -o {t}/o.npy --batch-size many",
        "--batch-size many: must be a whole number",
        None,
    ),
    (
        "encode-max-seq-length-0",
        "encode -i {t}/in.txt -o {t}/o.npy --max-seq-length 0",
        "--max-seq-length 0: must be >= 4",
        None,
    ),
    (
        "encode-pooling",
        "encode -i {t}/in.txt -o {t}/o.npy --pooling max",
        "--pooling max: must be one of cls, mean, lasttoken",
        None,
    ),
    (
        "encode-id-field-npy",
        "encode -i {t}/in.txt -o {t}/o.npy --id-field doc",
        "--id-field doc: ids go into a .parquet output",
        None,
    ),
    (
        "encode-device-warp9",
        "encode -i {t}/in.txt -o {t}/o.npy --device warp9",
        "--device warp9: not a torch device",
        None,
    ),
    (
        "encode-model-missing-path",
        "encode -i {t}/in.txt -o {t}/o.npy --model /missing/path",
        "--model /missing/path: no such folder",
        None,
    ),
    (
        "encode-model-a-file",
        "encode -i {t}/in.txt -o {t}/o.npy --model {t}/afile",
        "--model {t}/afile: a file, not a model folder",
        None,
    ),
    (
        "encode-model-empty-folder",
        "encode -i {t}/in.txt -o {t}/o.npy --model {t}/nomodel",
        "--model {t}/nomodel: a folder without a model",
        None,
    ),
    ("encode-unknown-option", "encode -i {t}/in.txt -o {t}/o.npy --normalise", "no such option: --normalise", None),
    # the hub: offline, and unreachable (a closed port answers at once)
    (
        "model-hub-offline",
        "encode -i {t}/in.txt -o {t}/o.npy --model some-org/some-model",
        "--model some-org/some-model: not a local folder, not in the Hugging Face cache, and HF_HUB_OFFLINE is set; "
        "offline, use 'bundled' (all-MiniLM-L6-v2) or 'bundled:multilingual-e5-small'",
        {"HF_HUB_OFFLINE": "1"},
    ),
    (
        "model-hub-unreachable",
        "encode -i {t}/in.txt -o {t}/o.npy --model some-org/some-model",
        "--model some-org/some-model: not a local folder, not in the Hugging Face cache, and the hub is unreachable (http://127.0.0.1:9",
        {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_ENDPOINT": "http://127.0.0.1:9"},
    ),
    # audit / demo
    ("audit-langs-not-a-code", "audit --langs en,e1 -o {t}/out", "--lang en,e1: 'e1' is not a language code", None),
    ("audit-langs-empty-item", "audit --langs en,,de -o {t}/out", "--lang en,,de: has an empty item", None),
    ("audit-langs-unknown", "audit --langs en,xx -o {t}/out", "language(s) ['xx'] not in the corpus", None),
    (
        "audit-langs-space-separated",
        "audit --langs en de -o {t}/out",
        "got unexpected extra argument(s) (de) (a list option takes comma",
        None,
    ),
    ("audit-mixed-no-colon", "audit --mixed de -o {t}/out", "--mixed de: takes LEAD:LATER", None),
    (
        "audit-language-grid-one",
        "audit --language-grid en -o {t}/out",
        "--language-grid en: a language grid needs at least 2 languages",
        None,
    ),
    (
        "audit-language-grid-all-and-more",
        "audit --language-grid all,de -o {t}/out",
        "--language-grid all,de: 'all' stands alone",
        None,
    ),
    (
        "audit-language-grid-unknown",
        "audit --language-grid en,xx -o {t}/out",
        "language(s) ['xx'] not in the corpus",
        None,
    ),
    (
        "audit-language-grid-not-a-code",
        "audit --language-grid en,e1 -o {t}/out",
        "--language-grid en,e1: 'e1' is not a language code",
        None,
    ),
    ("audit-n-1", "audit --langs en --n 1 -o {t}/out", "--n 1: must be >= 2", None),
    ("audit-docs-negative", "audit --langs en --docs -5 -o {t}/out", "--docs -5: must be >= 1", None),
    ("audit-seed-negative", "audit --langs en --seed -1 -o {t}/out", "--seed -1: must be in [0, 4294967295]", None),
    (
        "audit-segment-window",
        "audit --langs en --min-segment-tokens 50 --max-segment-tokens 10 -o {t}/out",
        "--min-segment-tokens 50 is above --max-segment-tokens 10",
        None,
    ),
    (
        "audit-out-is-a-file",
        "audit --langs en -o {t}/afile",
        "--out {t}/afile: is an existing file, not a folder",
        None,
    ),
    ("audit-missing-corpus", "audit --langs en --corpus {t}/missing.jsonl -o {t}/out", "{t}/missing.jsonl", None),
    (
        "audit-corpus-missing-field",
        "audit --langs en --corpus {t}/records.jsonl -o {t}/out",
        "{t}/records.jsonl: missing required field(s) 'text'",
        None,
    ),
    (
        "audit-inference",
        "audit --langs en --inference bayes -o {t}/out",
        "--inference bayes: must be one of cluster, wild",
        None,
    ),
    (
        "audit-bootstrap-without-wild",
        "audit --langs en --bootstrap-draws 999 -o {t}/out",
        "--bootstrap-draws applies only to --inference wild",
        None,
    ),
    ("demo-docs-0", "demo --docs 0 -o {t}/out", "--docs 0: must be >= 1", None),
    ("demo-out-is-a-file", "demo -o {t}/afile", "--out {t}/afile: is an existing file, not a folder", None),
    # attention
    ("attention-bins-0", "attention --bins 0 -o {t}/out", "--bins 0: must be >= 1", None),
    ("attention-docs-0", "attention --docs 0 -o {t}/out", "--docs 0: must be >= 1", None),
    ("attention-out-is-a-file", "attention -o {t}/afile", "--out {t}/afile: is an existing file, not a folder", None),
    # retrieval / sweep
    ("retrieval-no-benchmark", "retrieval", "missing option '--benchmark'", None),
    (
        "retrieval-missing-benchmark",
        "retrieval --benchmark MISSING",
        "--benchmark MISSING: not an existing folder or file, and not a known benchmark (fineweb-posq",
        None,
    ),
    (
        "sweep-missing-benchmark",
        "sweep --benchmark squad-posq-tin",
        "--benchmark squad-posq-tin: not an existing folder or file",
        None,
    ),
    (
        "tune-missing-benchmark",
        "tune --objective retrieval --benchmark MISSING",
        "--benchmark MISSING: not an existing folder or file",
        None,
    ),
    ("retrieval-c-is-not-calibration", "retrieval -b squad-posq-tiny -c 128,0.5,0.5", "no such option: -c", None),
    ("retrieval-nothing-to-run", "retrieval -b squad-posq-tiny --no-stock", "nothing to evaluate: --no-stock", None),
    ("retrieval-top-k-0", "retrieval -b squad-posq-tiny --top-k 0", "--top-k 0: must be >= 1", None),
    (
        "retrieval-out-is-a-file",
        "retrieval -b squad-posq-tiny -o {t}/afile",
        "--out {t}/afile: is an existing file, not a folder",
        None,
    ),
    (
        "retrieval-late-median",
        "retrieval -b squad-posq-tiny --late median",
        "--late median: must be one of max, mean",
        None,
    ),
    (
        "retrieval-late-chunks-0",
        "retrieval -b squad-posq-tiny --late max --late-chunks 0",
        "--late-chunks 0: must be 'semantic' or a whole number of tokens >= 1",
        None,
    ),
    (
        "retrieval-late-chunks-without-late",
        "retrieval -b squad-posq-tiny --late-chunks 64",
        "--late-chunks 64: applies only with --late",
        None,
    ),
    ("sweep-late-word", "sweep -b squad-posq-tiny --late maximum", "--late maximum: must be one of max, mean", None),
    ("sweep-step-0", "sweep -b squad-posq-tiny --fine --step 0", "--step 0: must be a number in (0, 1]", None),
    ("sweep-step-not-dividing-1", "sweep -b squad-posq-tiny --fine --step 0.3", "--step 0.3: step must divide 1", None),
    (
        "sweep-strength-1.5",
        "sweep -b squad-posq-tiny --strengths 0.5,1.5",
        "--strengths 0.5,1.5: must be a number in [0, 1]",
        None,
    ),
    ("sweep-nothing", "sweep -b squad-posq-tiny --no-grid", "nothing to sweep: --no-grid without --fine", None),
    # build-benchmark
    ("build-benchmark-k-0", "build-benchmark --k 0 -o {t}/bench", "--k 0: must be >= 1", None),
    (
        "build-benchmark-name-path",
        "build-benchmark --name ../up -o {t}/bench",
        "--name ../up: must be a plain name",
        None,
    ),
    (
        "build-benchmark-budget-langs",
        "build-benchmark --langs en --budget-langs de -o {t}/bench",
        "--budget-langs de: de not among --lang en",
        None,
    ),
    (
        "build-benchmark-unknown-unit",
        "build-benchmark --unit chapter -o {t}/bench",
        "no rows with unit='chapter'",
        None,
    ),
    (
        "build-benchmark-unknown-source",
        "build-benchmark --sources nope -o {t}/bench",
        "--sources nope: unknown source(s) ['nope']",
        None,
    ),
    # tune
    ("tune-space", "tune --space wide -o {t}/out", "--space wide: must be one of default, paper", None),
    (
        "tune-test-family",
        "tune --test-family manual -o {t}/out",
        "--test-family manual: not a document family of the corpus (families: debian-faq, installation-guide;",
        None,
    ),
    (
        "tune-test-family-retrieval",
        "tune --objective retrieval --test-family debian-faq -o {t}/out",
        "--test-family debian-faq: applies only to --objective fairness",
        None,
    ),
    (
        "audit-clusters",
        "audit --clusters bogus -o {t}/out",
        "--clusters bogus: must be one of conservative, set+topic, set, component",
        None,
    ),
    (
        "tune-variant",
        "tune --variants uniform,magic -o {t}/out",
        "--variants uniform,magic: must be one of uniform, prior, self, special",
        None,
    ),
    (
        "tune-variant-order",
        "tune --variants special+self -o {t}/out",
        "--variants special+self: must be one of uniform, prior, self, special, prior+self, prior+special, self+special",
        None,
    ),
    (
        "tune-trailing-policy",
        "tune --trailing-policies basket,flat -o {t}/out",  # the former name: the option as --help names it
        "--trailing basket,flat: must be one of basket, merge, weighted; got 'flat'",
        None,
    ),
    (
        "tune-strength-schedule",
        "tune --schedule flat,steep -o {t}/out",
        "--schedule flat,steep: must be one of flat, rising, falling; got 'steep'",
        None,
    ),
    (
        "calibration-schedule",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 16,1,1,schedule=up",
        "schedule= in calibration spec '16,1,1,schedule=up' must be flat, rising or falling",
        None,
    ),
    (
        "tune-self-share",
        "tune --variants self --self-shares 1.5 -o {t}/out",
        "--self-shares 1.5: must be a number in [0, 1]",
        None,
    ),
    (
        "tune-special-share",
        "tune --variants special --special-shares big -o {t}/out",
        "--special-shares big: must be 'original', 'equal'",
        None,
    ),
    (
        "calibration-variant-unknown",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 16,1,1,colour=red",
        "unknown variant 'colour'",
        None,
    ),
    (
        "calibration-trailing",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 16,1,1,trailing=last",
        "--calibration 16,1,1,trailing=last: trailing= in calibration spec '16,1,1,trailing=last' must be basket, merge or weighted; got 'last'",
        None,
    ),
    (
        "calibration-self-share",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 16,1,1,self=2",
        "self_share must be a number in [0, 1]",
        None,
    ),
    (
        "calibration-prior-missing",
        "audit --langs en -o {t}/out --calibration 16,1,1,prior={t}/missing.json",
        "prior file '{t}/missing.json' does not exist",
        None,
    ),
    (
        "calibration-prior-not-json",
        "encode -i {t}/in.txt -o {t}/o.npy --calibration 16,1,1,prior={t}/in.txt",
        "is not valid JSON",
        None,
    ),
    (
        "estimate-prior-out-type",
        "estimate-prior -o {t}/prior.txt",
        "--out {t}/prior.txt: unsupported output type '.txt'",
        None,
    ),
    ("estimate-prior-bins-0", "estimate-prior -o {t}/prior.json --bins 0", "--bins 0: must be >= 1", None),
    (
        "tune-objective",
        "tune --objective speed -o {t}/out",
        "--objective speed: must be one of fairness, retrieval",
        None,
    ),
    (
        "tune-test-fraction-1",
        "tune --test-fraction 1 -o {t}/out",
        "--test-fraction 1: must be a number in (0, 1)",
        None,
    ),
    (
        "tune-negative-drop",
        "tune --max-recall-drop -1 -o {t}/out",
        "--max-recall-drop -1: must be a number in [0, 100]",
        None,
    ),
    (
        "tune-drop-above-100",
        "tune --max-ndcg-drop 150 -o {t}/out",
        "--max-ndcg-drop 150: must be a number in [0, 100]",
        None,
    ),
    ("tune-docs-negative", "tune --docs -3 -o {t}/out", "--docs -3: must be >= 1", None),
    (
        "tune-benchmark-with-fairness",
        "tune --benchmark squad-posq-tiny -o {t}/out",
        "--benchmark squad-posq-tiny applies only to --objective retrieval",
        None,
    ),
    (
        "tune-save-model-is-a-file",
        "tune --save-model {t}/afile -o {t}/out",
        "--save-model {t}/afile: is an existing file",
        None,
    ),
    # embed
    (
        "embed-unknown-part",
        "embed --part passages -o {t}/store",
        "--part passages: must be one of documents, queries",
        None,
    ),
    ("embed-part-without-corpus", "embed --part documents -o {t}/store", "--part documents needs --corpus", None),
    ("embed-workers-0", "embed --workers 0 -o {t}/store", "--workers 0: must be >= 1", None),
    ("embed-out-is-a-file", "embed -o {t}/afile", "--out {t}/afile: is an existing file, not a folder", None),
    ("embed-missing-corpus", "embed --corpus {t}/missing.jsonl -o {t}/store", "{t}/missing.jsonl", None),
    # verify
    ("verify-no-store", "verify", "missing argument 'STORE'", None),
    ("verify-missing-store", "verify {t}/nostore", "STORE {t}/nostore: no such folder", None),
    ("verify-store-is-a-file", "verify {t}/afile", "STORE {t}/afile: is a file", None),
    ("verify-not-a-store", "verify {t}/nomodel", "STORE {t}/nomodel: is not a posfair embedding store", None),
    # the root
    ("unknown-command", "embedd -o {t}/store", "no such command 'embedd'", None),
    # a corpus that is not UTF-8, for every command that reads one: the file, the line and the byte (issue 57)
    *[
        (f"{command.split(' -o')[0].replace(' --', '-')}-corpus-not-utf8", f"{command} --corpus {{t}}/latin1.jsonl",
         "{t}/latin1.jsonl: line 2 is not UTF-8 text (invalid continuation byte at byte 40 of the line)", None)
        for command in ("audit -o {t}/out", "build-benchmark -o {t}/out", "attention -o {t}/out",
                        "estimate-prior -o {t}/prior.json", "fit -o {t}/out", "tune -o {t}/out",
                        "embed -o {t}/store", "embed --text-field body -o {t}/store")
    ],
    # a calibration named by its label, misspelt, or by a label that cannot carry a prior's values (issue 57)
    ("audit-calibration-misspelt", "audit --calibration defualt -o {t}/out", "got 'defualt'; did you mean 'default'?",
     None),
    ("audit-calibration-label-prior", "audit --calibration B16-L0.5-a1-prior -o {t}/out",
     "--calibration B16-L0.5-a1-prior: calibration label 'B16-L0.5-a1-prior': -prior names the positional prior by "
     "name only, not its values: give its file (the JSON posfair estimate-prior writes) after the label, "
     "B16-L0.5-a1-prior,prior=FILE", None),
    ("encode-calibration-label-ambiguous", "encode -i {t}/in.txt -o {t}/o.npy --calibration B16-L6-a1",
     "--calibration B16-L6-a1: calibration label 'B16-L6-a1': L6 is ambiguous", None),
    ("retrieval-calibration-label-unknown", "retrieval -b {t}/nomodel --calibration B16-L0.5-a1-risign -o {t}/out",
     "unknown setting 'risign'", None),
]  # fmt: skip
# mistakes only the loaded (bundled) model can tell
MODEL_MISTAKES = [
    ("encode-layers-beyond-the-model", "encode -i {t}/in.txt -o {t}/o.npy --layers 0+99", "--calibration 128,0+99,0.5: layers [99] out of "
     "range: the model has 6 layers", None),
    ("encode-max-seq-length-above-limit", "encode -i {t}/in.txt -o {t}/o.npy --max-seq-length 513", "--max-seq-length 513: max_seq_length "
     "must be in [4, 512]", None),
    ("attention-layers-beyond-the-model", "attention --profile-layers 0+99 -o {t}/out", "--profile-layers 0+99: layers [99] out of range", None),
]  # fmt: skip


@pytest.fixture
def files(tmp_path):
    """The inputs the mistakes refer to."""
    (tmp_path / "in.txt").write_text("a text\nanother text\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    rows = [{"id": "t1", "lang": "en", "text": "coffee", "body": "x"}, {"id": "t1", "lang": "fr", "text": "caf\xe9"}]
    (tmp_path / "latin1.jsonl").write_bytes(
        b"".join(json.dumps(r, ensure_ascii=False).encode("latin-1") + b"\n" for r in rows)
    )
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "records.jsonl").write_text('{"id": "a", "lang": "en", "body": "no text field"}\n')
    (tmp_path / "afile").write_text("not a folder")
    (tmp_path / "nomodel").mkdir()
    return tmp_path


def run(argv: str, folder, env=None):
    args = [a.replace("{t}", str(folder)) for a in argv.split()]
    return CliRunner().invoke(app, args, env=env)


def check_one_error_line(result, fragment: str, folder) -> str:
    fragment = fragment.replace("{t}", str(folder))
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("argv,fragment,env", [c[1:] for c in MISTAKES], ids=[c[0] for c in MISTAKES])
def test_a_mistake_is_one_line_and_exit_2(files, argv, fragment, env):
    check_one_error_line(run(argv, files, env), fragment, files)


@pytest.mark.parametrize("argv,fragment,env", [c[1:] for c in MODEL_MISTAKES], ids=[c[0] for c in MODEL_MISTAKES])
def test_a_mistake_the_model_tells_is_one_line_and_exit_2(files, argv, fragment, env):
    check_one_error_line(run(argv, files, env), fragment, files)
    assert not (files / "o.npy").exists() and not (files / "out").exists()


def test_an_output_folder_named_like_a_file_is_refused_before_anything_is_encoded(files, monkeypatch):
    from posfair.cli import checks

    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    (files / "dir.npy").mkdir()
    (files / "dir.npy" / "mine").write_text("user data")
    line = check_one_error_line(
        run("encode -i {t}/in.txt -o {t}/dir.npy", files), "--out {t}/dir.npy: is an existing folder, not a file", files
    )
    assert line == f"error: --out {files / 'dir.npy'}: is an existing folder, not a file"
    assert [p.name for p in (files / "dir.npy").iterdir()] == ["mine"]
    assert not list(files.glob(".dir.npy.posfair-cache*"))  # no cache was made: nothing was encoded


def test_the_hub_is_probed_once_and_fast(files, monkeypatch):
    import time

    from posfair.model import hub

    calls = []
    real = hub.probe_hub

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            calls.append(time.perf_counter() - t0)

    monkeypatch.setattr(hub, "probe_hub", timed)
    env = {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": None, "HF_ENDPOINT": "http://127.0.0.1:9"}
    check_one_error_line(
        run("encode -i {t}/in.txt -o {t}/o.npy --model some-org/some-model", files, env),
        "the hub is unreachable",
        files,
    )
    assert len(calls) == 1 and calls[0] <= hub.PROBE_TIMEOUT + 0.5  # one probe, no retries


def test_the_library_refuses_an_unreachable_hub_id_by_name(monkeypatch):
    import posfair
    from posfair.model.hub import ModelNotFound
    from posfair.runtime.errors import PosfairInputError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelNotFound,
        match="cannot load model 'some-org/some-model': not a local folder, not in the Hugging Face cache",
    ) as err:
        posfair.load_model("some-org/some-model")
    assert isinstance(err.value, PosfairInputError) and isinstance(err.value, OSError)


def test_an_unexpected_error_is_one_line_with_a_hint_and_debug_shows_the_traceback(files, monkeypatch):
    import posfair.files.reading

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(posfair.files.reading, "read_texts", broken)
    args = "encode -i {t}/in.txt -o {t}/o.npy"
    res = run(args, files)
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [
        "error: unexpected RuntimeError: boom second line (rerun with --debug for the traceback)"
    ]
    res = run("--debug " + args, files)
    assert res.exit_code == 1
    assert res.stderr.startswith("Traceback (most recent call last):") and "RuntimeError: boom" in res.stderr
    assert res.stderr.splitlines()[-1] == "error: unexpected RuntimeError: boom second line"


def test_the_script_goes_through_the_same_boundary(files, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["build-benchmark", "--k", "0", "-o", str(files / "bench")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: --k 0: must be >= 1; got 0\n"
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("posfair ")


def test_a_hub_id_in_the_cache_is_not_refused_offline(tmp_path, monkeypatch):
    from posfair.model.hub import check_model_source

    snapshot = tmp_path / "models--some-org--some-model" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--some-org--some-model" / "refs").mkdir()
    (tmp_path / "models--some-org--some-model" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert check_model_source("some-org/some-model", cache_folder=str(tmp_path)) == "cache"
    monkeypatch.setenv("SENTENCE_TRANSFORMERS_HOME", str(tmp_path))
    assert check_model_source("some-org/some-model") == "cache"


@pytest.mark.parametrize(
    "raised, code, line",
    [
        (
            ValueError("a bug inside the audit"),
            1,
            "error: unexpected ValueError: a bug inside the audit (rerun with --debug for the traceback)",
        ),
        (PosfairInputError("too few segment sets for n=4"), 2, "error: too few segment sets for n=4"),
    ],
)
def test_a_pipeline_error_is_the_users_only_when_the_library_says_so(files, monkeypatch, raised, code, line):
    """Inside a run, the library's PosfairInputError (data that cannot serve the settings) exits 2;
    any other ValueError is a bug: exit 1 with the hint, not passed off as the user's mistake."""
    import posfair.fairness.pipeline

    def failing(*args, **kwargs):
        raise raised

    monkeypatch.setattr(posfair.fairness.pipeline, "audit", failing)
    res = run("audit --langs en --n 3 --docs 10 --out {t}/audit-out", files)
    assert (res.exit_code, res.stderr.splitlines()) == (code, [line])


#: every command that writes a run folder, and the command whose results the folder holds
RUN_FOLDER_COMMANDS = [
    ("audit -o {t}/done", "demo"),
    ("tune -o {t}/done", "demo"),
    ("attention -o {t}/done", "demo"),
    ("build-benchmark -o {t}/done", "demo"),
    ("retrieval -b posir -o {t}/done", "demo"),
    ("sweep -b posir -o {t}/done", "audit"),
    ("demo -o {t}/done", "audit"),
]


@pytest.mark.parametrize(("argv", "other"), RUN_FOLDER_COMMANDS, ids=[c[0].split()[0] for c in RUN_FOLDER_COMMANDS])
def test_a_folder_of_another_commands_results_is_refused_before_any_work(files, monkeypatch, argv, other):
    """Issue 57 item 4.5: ``audit --out`` a folder of ``posfair demo``'s results drew progress bars and encoded for
    ~14 s before it refused; now every command writing a run folder refuses it with its options' checks: one line,
    exit 2, no model loaded, nothing printed or written."""
    import time

    from posfair.cli import checks
    from posfair.files.atomic import atomic_write_text
    from posfair.files.run_folder import RunFolder

    monkeypatch.setattr(checks, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with RunFolder(files / "done", other, {"made": "elsewhere"}):
        atomic_write_text(files / "done" / "report.html", "another command's report")
    before = {p: p.read_bytes() for p in (files / "done").rglob("*")}
    t0 = time.perf_counter()
    result = run(argv, files)
    check_one_error_line(
        result,
        f"--out {{t}}/done: holds the results of 'posfair {other}' (posfair-run.json), which this command does not "
        "replace: give another folder",
        files,
    )
    assert time.perf_counter() - t0 < 20  # before: the audit ran (encoding ~14 s) and refused when it wrote
    assert result.stdout == ""
    assert {p: p.read_bytes() for p in (files / "done").rglob("*")} == before
