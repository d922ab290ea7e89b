"""Output folders keyed and checked by content (posfair.files.run_folder): what a rerun removes, keeps, refuses and says."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import warnings
from pathlib import Path

import pytest

from posfair.files.atomic import atomic_write_text
from posfair.files.run_folder import (
    JOURNAL,
    MANIFEST,
    RESULT_FORMAT,
    RunFolder,
    RunFolderWarning,
    refuse_other_command,
)
from posfair.runtime.errors import PosfairInputError


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(root, files: dict[str, str], key=None, command="audit", state=()):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with RunFolder(root, command, key or {"a": 1}, state=state) as rf:
            for rel, text in files.items():
                atomic_write_text(root / rel, text)
    return rf, [str(w.message) for w in caught if issubclass(w.category, RunFolderWarning)]


def test_the_manifest_lists_every_file_written_with_its_sha256(tmp_path):
    rf, said = _run(tmp_path, {"report.html": "<p>r</p>", "tables/sigma.csv": "a,b\n1,2\n"})
    body = json.loads((tmp_path / MANIFEST).read_text())
    assert body["command"] == "audit" and body["complete"] is True and body["format"] == RESULT_FORMAT
    assert body["files"] == {
        "report.html": _sha(tmp_path / "report.html"),
        "tables/sigma.csv": _sha(tmp_path / "tables/sigma.csv"),
    }
    assert body["fingerprint"] == rf.fingerprint and said == []
    assert not (tmp_path / JOURNAL).exists()


def test_a_rerun_removes_the_earlier_runs_files_it_did_not_write_and_says_why(tmp_path):
    _run(tmp_path, {"tables/sigma_B16.csv": "16", "tables/tau_B16.csv": "16", "report.html": "old"}, key={"B": 16})
    rf, said = _run(tmp_path, {"tables/sigma_B32.csv": "32", "report.html": "new"}, key={"B": 32})
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        MANIFEST,
        "report.html",
        "tables/sigma_B32.csv",
    ]
    assert rf.removed == ["tables/sigma_B16.csv", "tables/tau_B16.csv"] and rf.changed == ["B"]
    assert len(said) == 1 and "made from other inputs (changed: B)" in said[0]
    assert sorted(json.loads((tmp_path / MANIFEST).read_text())["files"]) == ["report.html", "tables/sigma_B32.csv"]


def test_the_same_inputs_again_say_nothing(tmp_path):
    _run(tmp_path, {"report.html": "r"})
    rf, said = _run(tmp_path, {"report.html": "r"})
    assert said == [] and rf.changed == [] and rf.removed == []


def test_files_changed_since_posfair_wrote_them_and_files_it_never_wrote_are_kept_and_named(tmp_path):
    _run(tmp_path, {"old_table.csv": "posfair's", "report.html": "r"})
    (tmp_path / "old_table.csv").write_text("edited by the user")
    (tmp_path / "notes.txt").write_text("mine")
    rf, said = _run(tmp_path, {"report.html": "r2"})
    assert (tmp_path / "old_table.csv").read_text() == "edited by the user"
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert rf.removed == [] and rf.kept == ["old_table.csv"]
    assert len(said) == 1
    assert (
        "2 files were not written by this audit and are kept (1 changed since posfair wrote it, the other not "
        "made by posfair" in said[0]
    )
    assert "old_table.csv" in said[0] and "notes.txt" in said[0]


def test_state_folders_and_nested_run_folders_are_left_alone(tmp_path):
    (tmp_path / "cache" / "ns").mkdir(parents=True)
    with RunFolder(tmp_path, "tune", {"k": 1}, state=["cache"]):
        atomic_write_text(tmp_path / "cache" / "ns" / "part-1.arrow", "vectors")
        atomic_write_text(tmp_path / "summary.md", "s")
        with RunFolder(tmp_path / "test_audit", "audit", {"k": 2}):
            atomic_write_text(tmp_path / "test_audit" / "report.html", "inner")
    outer = json.loads((tmp_path / MANIFEST).read_text())
    inner = json.loads((tmp_path / "test_audit" / MANIFEST).read_text())
    assert list(outer["files"]) == ["summary.md"] and outer["state"] == ["cache"]
    assert list(inner["files"]) == ["report.html"]
    # a rerun writing nothing keeps the state and the nested run, removes only the outer run's own file
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunFolderWarning)
        with RunFolder(tmp_path, "tune", {"k": 1}, state=["cache"]) as rf:
            pass
    assert rf.removed == ["summary.md"]
    assert (tmp_path / "cache" / "ns" / "part-1.arrow").exists() and (tmp_path / "test_audit" / "report.html").exists()


def test_another_commands_folder_is_refused_before_anything_is_written(tmp_path):
    _run(tmp_path, {"runs/stock.json": "{}"}, command="retrieval")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(PosfairInputError, match=r"holds the results of 'posfair retrieval' \(posfair-run.json\)"):
        with RunFolder(tmp_path, "audit", {}):
            raise AssertionError("not reached")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_unreadable_manifest_is_refused_not_guessed(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(PosfairInputError, match=f"{MANIFEST}: unreadable"):
        with RunFolder(tmp_path, "audit", {}):
            pass


def _killed_run(root):
    with RunFolder(root, "audit", {"a": 2}):
        atomic_write_text(root / "partial.csv", "written before the kill")
        os._exit(9)  # killed: no __exit__, no manifest update


def test_a_killed_runs_files_are_known_as_posfairs_to_the_next_run(tmp_path):
    _run(tmp_path, {"report.html": "r"}, key={"a": 1})
    child = mp.get_context("fork").Process(target=_killed_run, args=(tmp_path,))
    child.start()
    child.join()
    assert child.exitcode == 9 and (tmp_path / JOURNAL).exists()
    rf, said = _run(tmp_path, {"report.html": "r3"}, key={"a": 1})
    # partial.csv: written by posfair (the journal says so, with its digest), so removed, never reported as foreign
    assert rf.removed == ["partial.csv"] and not (tmp_path / "partial.csv").exists()
    assert not any("not written by this" in s for s in said)


def test_a_failed_run_keeps_every_file_posfair_made_listed(tmp_path):
    _run(tmp_path, {"a.csv": "1"}, key={"a": 1})
    with pytest.raises(RuntimeError):
        with RunFolder(tmp_path, "audit", {"a": 2}):
            atomic_write_text(tmp_path / "b.csv", "2")
            raise RuntimeError("the run failed")
    body = json.loads((tmp_path / MANIFEST).read_text())
    assert body["complete"] is False and sorted(body["files"]) == ["a.csv", "b.csv"]


def test_a_state_location_given_relative_to_the_working_directory_is_state(tmp_path, monkeypatch):
    """A store's root as a user gives it ("out/cache" from the working directory) is the run folder's state, not
    "out/out/cache": its shards are never listed as files, so never removed as stale."""
    monkeypatch.chdir(tmp_path)
    root = Path("out")
    with RunFolder(root, "audit", {"a": 1}, state=[Path("out/cache")]):
        atomic_write_text(root / "cache" / "part-1.arrow", "vectors")
        atomic_write_text(root / "report.html", "r")
    assert list(json.loads((root / MANIFEST).read_text())["files"]) == ["report.html"]
    with RunFolder(root, "audit", {"a": 2}, state=[Path("out/cache")]) as rf:
        atomic_write_text(root / "report.html", "r2")
    assert rf.removed == [] and (root / "cache" / "part-1.arrow").read_text() == "vectors"


def test_a_store_that_is_the_folder_itself_makes_everything_state(tmp_path):
    """--cache and --out naming one folder: nothing in it is listed, removed or reported as foreign."""
    with RunFolder(tmp_path, "audit", {"a": 1}, state=[tmp_path]):
        atomic_write_text(tmp_path / "ns" / "part-1.arrow", "vectors")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunFolderWarning)
        with RunFolder(tmp_path, "audit", {"a": 1}, state=[tmp_path]) as rf:
            pass
    assert rf.removed == [] and (tmp_path / "ns" / "part-1.arrow").exists()
    assert json.loads((tmp_path / MANIFEST).read_text())["files"] == {}


def test_the_corpus_fingerprint_reads_content_with_missing_values():
    import numpy as np
    import pandas as pd

    from posfair.corpus import corpus_content_fingerprint

    a = pd.DataFrame({"id": ["t1", "t2"], "lang": ["en", "en"], "text": ["x", "y"], "title": ["T", None]})
    b = a.copy()
    b.loc[1, "title"] = np.nan
    assert corpus_content_fingerprint(a) == corpus_content_fingerprint(b)  # one missing value, however spelled
    assert corpus_content_fingerprint(a) == corpus_content_fingerprint(a.iloc[::-1])  # row order is not content
    c = a.copy()
    c.loc[1, "title"] = "None"
    assert corpus_content_fingerprint(c) != corpus_content_fingerprint(a)  # the text "None" is not a missing title
    d = a.copy()
    d.loc[0, "text"] = "x "
    assert corpus_content_fingerprint(d) != corpus_content_fingerprint(a)


def test_independent_parts_of_one_folder_keep_each_others_files(tmp_path):
    """A benchmark's domains are built one at a time into one folder: each domain is a part with its own records;
    building domain b neither removes nor reports domain a's files."""
    with RunFolder(tmp_path, "build-benchmark", {"domain": "a"}, part="a"):
        atomic_write_text(tmp_path / "eng-Latn" / "a" / "corpus.parquet", "a")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RunFolderWarning)
        with RunFolder(tmp_path, "build-benchmark", {"domain": "b"}, part="b", state=["eng-Latn/a"]) as rf:
            atomic_write_text(tmp_path / "eng-Latn" / "b" / "corpus.parquet", "b")
    assert rf.removed == [] and (tmp_path / "eng-Latn" / "a" / "corpus.parquet").read_text() == "a"
    assert list(json.loads((tmp_path / "posfair-run.b.json").read_text())["files"]) == ["eng-Latn/b/corpus.parquet"]
    assert list(json.loads((tmp_path / "posfair-run.a.json").read_text())["files"]) == ["eng-Latn/a/corpus.parquet"]


def test_one_file_kept_or_removed_is_counted_in_the_singular(tmp_path, caplog):
    """Issue 57 item 4.4: "1 files were not written by this audit" read badly; every count here agrees with it."""
    import logging

    _run(tmp_path, {"a.csv": "1", "b.csv": "2"})
    (tmp_path / "notes.txt").write_text("mine")
    with caplog.at_level(logging.INFO, logger="posfair.files.run_folder"):
        _, said = _run(tmp_path, {"a.csv": "1"})
    assert said == [
        f"{tmp_path}: 1 file was not written by this audit and is kept (not made by posfair or by a version "
        f"without {MANIFEST}): notes.txt; this run's files are listed in {MANIFEST}"
    ]
    assert f"{tmp_path}: removed 1 file of the earlier run that this one did not write" in caplog.messages
    (tmp_path / "a.csv").write_text("edited")
    _, said = _run(tmp_path, {"c.csv": "3"}, key={"a": 1})
    assert (
        "2 files were not written by this audit and are kept (1 changed since posfair wrote it, the other not "
        "made by posfair" in said[0]
    )
    only = tmp_path / "only-changed"
    _run(only, {"a.csv": "1"})
    (only / "a.csv").write_text("edited")
    _, said = _run(only, {"b.csv": "2"})
    assert "1 file was not written by this audit and is kept (changed since posfair wrote it): a.csv;" in said[0]


def test_a_folder_of_another_command_is_refused_without_opening_it(tmp_path):
    """The refusal a command makes with its options' checks (before any work): the folder's manifest or one of its
    parts' names another command; a folder of the same command, an empty one and a missing one pass, unchanged."""
    refuse_other_command(tmp_path / "missing", "audit")
    refuse_other_command(tmp_path, "audit")
    with RunFolder(tmp_path, "build-benchmark", {"domain": "a"}, part="a"):
        atomic_write_text(tmp_path / "eng-Latn" / "a" / "corpus.parquet", "a")
    refuse_other_command(tmp_path, "build-benchmark")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(
        PosfairInputError, match=r"holds the results of 'posfair build-benchmark' \(posfair-run.a.json\)"
    ):
        refuse_other_command(tmp_path, "audit")
    with pytest.raises(PosfairInputError, match=r"posfair-run.a.json\), which this command does not replace"):
        with RunFolder(tmp_path, "audit", {}):  # before: only its own manifest was read, and the audit wrote here
            raise AssertionError("not reached")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "missing").exists()
