"""posfair fit's save is whole or not at all (posfair.repair.fitting.publish): a save killed after any number of its
file operations leaves ``posfair.load_model(out)`` the whole previous model or the whole new one, never a mix; the
next fit puts the previous model back, leaves no temporary behind, and the user's own files in ``out`` survive."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import posfair
from posfair.repair import fitting as publish_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fit import _two_families  # noqa: E402

TEXTS = ["The first section of a report.", "A second, longer section that says something else entirely."]
#: the file operations a kill can fall between (pathlib, shutil and posfair.files.atomic all go through these)
OPERATIONS = ("rename", "replace", "link", "unlink", "remove", "rmdir", "mkdir", "symlink")


class Killed(BaseException):
    """The process dies here: no ``except`` of the code under test catches it."""


class KillAfter:
    """Patches the file operations of ``os``: the first ``k`` run, then the process is dead (every later one,
    clean-up code's included, raises :class:`Killed` and does nothing)."""

    def __init__(self, monkeypatch, k: int):
        self.left = k
        self.calls = 0
        for name in OPERATIONS:
            monkeypatch.setattr(os, name, self._wrap(getattr(os, name)))

    def _wrap(self, op):
        def run(*args, **kwargs):
            if self.left <= 0:
                raise Killed
            self.left -= 1
            self.calls += 1
            return op(*args, **kwargs)

        return run


@pytest.fixture(scope="module")
def two_models(tiny_model_path, tmp_path_factory):
    """Folders of two tiny models that differ in their weights and their pooling (a folder mixing them gives
    neither's vectors), and each one's vectors of :data:`TEXTS`."""
    path, _ = tiny_model_path("bert-mean")
    root = tmp_path_factory.mktemp("two-models")
    old = posfair.load_model(str(path), pooling="mean")
    old.save(str(root / "old"))
    new = posfair.load_model(str(path), pooling="cls")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    new.save(str(root / "new"))
    vectors = {k: posfair.load_model(str(root / k)).encode(TEXTS) for k in ("old", "new")}
    assert not np.allclose(vectors["old"], vectors["new"], atol=1e-3)
    return root, vectors


def _which(out: Path, vectors: dict[str, np.ndarray], seen: dict | None = None) -> str:
    """'old' or 'new': the whole model ``posfair.load_model(out)`` loads (fails on anything else).  With ``seen``, a
    folder read exactly as one already loaded (the same names of the same files, unchanged since: the loader reads
    nothing else) is not loaded again."""
    key = _read_as(out) if seen is not None else None
    if key is not None and key in seen:
        return seen[key]
    got = posfair.load_model(str(out)).encode(TEXTS)
    same = [k for k, v in vectors.items() if v.shape == got.shape and np.allclose(v, got, atol=1e-6)]
    assert len(same) == 1, f"{out}: loads neither whole model"
    if key is not None:
        seen[key] = same[0]
    return same[0]


def _read_as(out: Path) -> tuple:
    """What ``posfair.load_model(out)`` reads: the folder it picks and its files (name, size, modification time:
    each file was copied with its time from one of the two models' folders, and nothing writes one in place)."""
    from posfair.model.fair_model import SAVING_FOLDER, published_folder

    folder = Path(published_folder(str(out)))
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in (SAVING_FOLDER, "fit")]
        for name in names:
            st = os.stat(os.path.join(root, name))
            files.append((os.path.relpath(os.path.join(root, name), folder), st.st_size, st.st_mtime_ns))
    return (str(folder.relative_to(out)), tuple(sorted(files)))


def _setup(root: Path, out: Path, with_old: bool = True) -> Path:
    """``out`` holding the old model (or none), a user's file and a report; the new model as the fit's candidate."""
    if with_old:
        shutil.copytree(root / "old", out)
    (out / "fit").mkdir(parents=True)
    (out / "notes.txt").write_text("the user's own")
    (out / "fit" / "heldout.md").write_text("the report")
    shutil.copytree(root / "new", out / "fit" / "candidate")
    return out / "fit" / "candidate"


def _posfair_leftovers(out: Path) -> list[str]:
    """What of posfair's temporaries is left in ``out`` (the save folder, a temporary file; the fit's candidate,
    not yet moved when the kill came before the save's first step, is the next fit's to replace)."""
    left = [p.name for p in out.iterdir() if p.name.startswith(".") and p.name != publish_module.RECORD]
    return left + [p.name for p in (out / "fit").iterdir() if p.name not in ("heldout.md", "candidate")]


@pytest.mark.parametrize("with_old", [True, False], ids=["over-a-model", "first-model"])
def test_a_save_killed_after_any_step_leaves_one_whole_model(two_models, tmp_path, with_old):
    root, vectors = two_models
    seen, loaded = [], {}
    for k in range(10_000):
        out = tmp_path / f"k{k}"
        candidate = _setup(root, out, with_old)
        with pytest.MonkeyPatch.context() as mp:
            kill = KillAfter(mp, k)
            try:
                publish_module.publish(candidate, out)
                finished = True
            except Killed:
                finished = False
        assert (out / "notes.txt").read_text() == "the user's own"
        assert (out / "fit" / "heldout.md").read_text() == "the report"
        try:
            now = _which(out, vectors, loaded)
        except OSError:  # no whole model at all: only before the first model is published
            assert not with_old, k
            now = None
        seen.append(now)
        # the next fit finds what the kill left: the previous state put back whole, nothing of posfair's left over
        publish_module.recover(out)
        assert _posfair_leftovers(out) == [], k
        assert (out / "notes.txt").read_text() == "the user's own"
        if now is not None:
            assert _which(out, vectors, loaded) == now, k
        shutil.rmtree(out)
        if finished:
            break
    assert kill.calls == k and seen[-1] == "new"
    # the old model (or none) until one step publishes the new one, and the new one from then on
    first_new = seen.index("new")
    assert set(seen[:first_new]) == {"old" if with_old else None} and set(seen[first_new:]) == {"new"}, seen


def test_a_rerun_after_a_killed_save_puts_the_old_model_back_and_saves_whole(two_models, tmp_path, monkeypatch):
    from posfair.repair import fitting

    root, vectors = two_models
    with pytest.MonkeyPatch.context() as mp:  # how many file operations a whole save takes
        count = KillAfter(mp, 10**9)
        publish_module.publish(_setup(root, tmp_path / "whole"), tmp_path / "whole")
    out = tmp_path / "out"
    candidate = _setup(root, out)
    with pytest.MonkeyPatch.context() as mp:
        KillAfter(mp, count.calls // 2)  # half-way through the save
        with pytest.raises(Killed):
            publish_module.publish(candidate, out)
    assert _which(out, vectors) == "old"
    res = fitting.fit_repair(str(root / "new"), out, corpus=_two_families(), method="tempscale", max_seq_length=64,
                             save_failing=True)  # fmt: skip
    assert res.saved
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [publish_module.RECORD]
    assert sorted(p.name for p in (out / "fit").iterdir() if not p.name.startswith("tradeoff")) == [
        "benchmark",
        "heldout.json",
        "heldout.md",
    ]
    assert (out / "notes.txt").read_text() == "the user's own"
    fitted = posfair.load_model(str(out))
    assert fitted.encode(TEXTS).shape == vectors["new"].shape
    assert {p.name for p in (root / "new").iterdir()} <= {p.name for p in out.iterdir()}


def test_the_previous_models_own_entries_go_and_nothing_else(two_models, tmp_path):
    root, vectors = two_models
    out = tmp_path / "out"
    candidate = _setup(root, out)
    publish_module.publish(candidate, out)  # now recorded as posfair's model
    (out / "extra-of-the-model.txt").write_text("x")
    record = out / publish_module.RECORD
    record.write_text(record.read_text().replace('"entries": [', '"entries": ["extra-of-the-model.txt", '))
    shutil.copytree(root / "old", out / "fit" / "candidate")
    publish_module.publish(out / "fit" / "candidate", out)
    assert _which(out, vectors) == "old"
    assert not (out / "extra-of-the-model.txt").exists()  # the previous model's, by its record
    assert (out / "notes.txt").read_text() == "the user's own"
