"""Output folders that say what is in them: the files of the last run, their SHA-256, and what they were made from.

Every command that writes a folder (``audit``, ``retrieval``, ``sweep``, ``tune``, ``attention``, ``demo``,
``build-benchmark``) does it inside a :class:`RunFolder`.  While it is open, every file that posfair writes under
the folder (through :func:`posfair.files.atomic.atomic_path`, the one way posfair writes a file) is recorded with its
SHA-256 in a journal; when the run ends, ``posfair-run.json`` lists them::

    {"format": 1, "command": "audit", "key": {...}, "fingerprint": "...", "complete": true,
     "files": {"report.html": "<sha256>", "tables/sigma_main.csv": "<sha256>", ...},
     "state": ["cache"]}

A rerun into the same folder:

* a folder holding another command's results is refused (one line, before any work);
* files the earlier run wrote and this one did not are removed, but only when their bytes are still the ones
  posfair wrote (a file changed since is kept, with a warning naming it);
* files posfair did not write (a user's notes, the results of a posfair version without this manifest) are never
  removed: they are named in a warning;
* when what the results were made from changed (``key``: the model's fingerprint, the corpus or benchmark
  content, the settings, the calibrations, :data:`RESULT_FORMAT`), a warning says which parts changed;
* a run that fails or is killed leaves a manifest (or a journal) that still lists every file posfair made, so
  the next run can tell them from a user's.

``state`` names the sub-folders that hold resumable state checked by its own content key (an embedding cache,
a sweep's finished runs): neither listed file by file nor ever removed here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from posfair.files.atomic import atomic_write_json, observing_writes
from posfair.runtime.errors import PosfairInputError
from posfair.runtime.stacklevel import user_stacklevel

__all__ = [
    "MANIFEST",
    "RESULT_FORMAT",
    "RunFolder",
    "RunFolderWarning",
    "content_fingerprint",
    "file_sha256",
    "refuse_other_command",
]

log = logging.getLogger(__name__)

#: the file that lists a run's files
MANIFEST = "posfair-run.json"
#: written while a run is open (one line per file written): what a killed run made
JOURNAL = ".posfair-run.journal"


def _records(name: str) -> bool:
    """Whether a file name is a run folder's own record (a manifest or journal, of the folder or of one part)."""
    return (name.startswith("posfair-run") and name.endswith(".json")) or (
        name.startswith(".posfair-run") and name.endswith(".journal")
    )


#: the format of posfair's result files; part of every result key, so results of another format are never reused
RESULT_FORMAT = 1


class RunFolderWarning(UserWarning):
    """An output folder holds files this run did not write, or results made from something else."""


def content_fingerprint(obj: Any) -> str:
    """A SHA-256 (20 hex digits) of ``obj`` as canonical JSON (sorted keys; non-JSON values by ``str``)."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:20]


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _count(n: int, noun: str) -> str:
    """``"1 file"``, ``"2 files"``: a count with its noun in the right number."""
    return f"{n} {noun if n == 1 else noun + 's'}"


def _canonical(obj: Any) -> Any:
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _read_record(path: Path) -> dict[str, Any]:
    """A manifest's body; PosfairInputError naming it when it is not one (posfair cannot tell its files from yours)."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(body, dict) or not isinstance(body.get("files", {}), dict):
            raise ValueError("not a posfair run manifest")
    except (OSError, ValueError) as exc:
        raise PosfairInputError(
            f"{path}: unreadable ({exc}); posfair cannot tell its files from yours: move the folder away "
            "or choose another one"
        ) from None
    return body


def refuse_other_command(root: str | os.PathLike, command: str) -> None:
    """PosfairInputError (one line) when the folder ``root`` holds the results of another command than ``command``
    (a manifest of the folder or of one of its parts names another command), or a manifest that cannot be read.

    The refusal :class:`RunFolder` makes when it opens; a command calls it with its options' checks as well, so a
    folder of another command is refused before any work (no model loaded, nothing encoded).  A folder that does
    not exist yet, or holds no manifest, passes."""
    root = Path(root)
    if not root.is_dir():
        return
    for path in sorted(root.glob("posfair-run*.json")):
        other = _read_record(path).get("command")
        if other not in (None, command):
            raise PosfairInputError(
                f"{root}: holds the results of 'posfair {other}' ({path.name}), which this command does not "
                "replace: give another folder"
            )


class RunFolder:
    """The output folder of one run of ``command``, made from ``key`` (see the module docstring).

    ``state``: the folders of resumable state with its own content check: a ``str`` names a sub-folder of ``root``
    (``"cache"``), a ``Path`` is a location as a user gives it (relative to the working directory), counted when it
    lies inside ``root``.  ``part``: one of several independent runs in one folder (a benchmark's domains), with
    its own records (``posfair-run.<part>.json``); the other parts' files are then its ``state``.  Use as a context manager around everything the run writes; :attr:`changed` names the parts
    of the key that differ from the folder's previous run (empty when it matched or there was none), and
    :attr:`files` / :attr:`removed` / :attr:`kept` say what the run wrote, removed and left alone.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        command: str,
        key: Mapping[str, Any],
        *,
        state: Iterable[Any] = (),
        part: str | None = None,
    ):
        self.root = Path(root)
        # one part of a folder that holds several independent runs (a benchmark's domains): its own records
        self.manifest = MANIFEST if part is None else f"posfair-run.{part}.json"
        self.journal = JOURNAL if part is None else f".posfair-run.{part}.journal"
        self.command = command
        self.key = _canonical(dict(key) | {"result_format": RESULT_FORMAT})
        self.fingerprint = content_fingerprint(self.key)
        # a str names a sub-folder of the run folder ("cache"); a path (os.PathLike) is a location, relative to the
        # working directory like every path a user gives (an embedding store's root): kept when it lies inside
        self.state = sorted({self._relative(s if isinstance(s, str) else Path(s).absolute()) for s in state} - {None})
        self.files: dict[str, str] = {}
        self.previous: dict[str, str] = {}
        self.changed: list[str] = []
        self.removed: list[str] = []
        self.kept: list[str] = []
        self._journal = None
        self._observing = None

    # -- opening: the previous run, refusals before any work ---------------------------------------
    def __enter__(self) -> RunFolder:
        refuse_other_command(self.root, self.command)
        old = self._read_manifest()
        self.previous = {str(k): str(v) for k, v in ((old or {}).get("files") or {}).items()}
        self.previous.update(self._read_journal())
        if old is not None and old.get("fingerprint") != self.fingerprint:
            before = old.get("key") or {}
            self.changed = sorted(k for k in set(before) | set(self.key) if before.get(k) != self.key.get(k))
            warnings.warn(
                f"{self.root}: replacing the results of an earlier {self.command} made from other inputs "
                f"(changed: {', '.join(self.changed) or 'unknown'}); its files are replaced or removed",
                RunFolderWarning,
                stacklevel=user_stacklevel(),
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self._journal = open(self.root / self.journal, "a", encoding="utf-8")  # noqa: SIM115 (closed in __exit__)
        self._observing = observing_writes(self._note)
        self._observing.__enter__()
        return self

    def _relative(self, path: Any) -> str | None:
        p = Path(path)
        if p.is_absolute() or str(p).startswith(".."):
            try:
                p = p.resolve().relative_to(self.root.resolve())
            except ValueError:
                return None  # outside the folder
        return p.as_posix().rstrip("/") or "."

    def _read_manifest(self) -> dict[str, Any] | None:
        path = self.root / self.manifest
        return _read_record(path) if path.exists() else None

    def _read_journal(self) -> dict[str, str]:
        """Files a killed run wrote (each line: sha256, a tab, the relative path; a torn last line is ignored)."""
        path = self.root / self.journal
        if not path.exists():
            return {}
        out = {}
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            digest, _, rel = line.partition("\t")
            if len(digest) == 64 and rel:
                out[rel] = digest
        return out

    # -- while open ---------------------------------------------------------------------------------
    def _note(self, path: Path) -> bool:
        rel = self._relative(Path(path).absolute())
        if rel is None:
            return False  # another folder's file: not this run's
        if _records(rel.rsplit("/", 1)[-1]) or self._in_state(rel):
            return True  # this run's or a nested run's own record; state with its own content check
        digest = file_sha256(path)
        self.files[rel] = digest
        self._journal.write(f"{digest}\t{rel}\n")
        self._journal.flush()
        return True

    def _in_state(self, rel: str) -> bool:
        # "." : the store is the folder itself (--cache and --out alike): everything in it is state
        return any(s == "." or rel == s or rel.startswith(s + "/") for s in self.state)

    # -- closing ------------------------------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb) -> None:
        self._observing.__exit__(exc_type, exc, tb)
        self._journal.close()
        if exc_type is None:
            self._remove_stale()
            self._name_foreign()
            files = dict(sorted(self.files.items()))
        else:  # a failed run: every file posfair made stays listed (the next run can tell them from a user's)
            files = dict(sorted((self.previous | self.files).items()))
        atomic_write_json(
            self.root / self.manifest,
            {
                "format": RESULT_FORMAT,
                "command": self.command,
                "key": self.key,
                "fingerprint": self.fingerprint,
                "complete": exc_type is None,
                "files": files,
                "state": self.state,
            },
        )
        (self.root / self.journal).unlink(missing_ok=True)

    def _remove_stale(self) -> None:
        for rel, digest in sorted(self.previous.items()):
            if rel in self.files or self._in_state(rel):
                continue
            path = self.root / rel
            if not path.is_file():
                continue
            if file_sha256(path) == digest:
                path.unlink()
                self.removed.append(rel)
                self._prune(path.parent)
            else:
                self.kept.append(rel)
        if self.removed:
            log.info(
                "%s: removed %s of the earlier run that this one did not write",
                self.root,
                _count(len(self.removed), "file"),
            )

    def _prune(self, folder: Path) -> None:
        """Remove the folders that removing a stale file emptied (up to the run's root)."""
        root = self.root.resolve()
        folder = folder.resolve()
        while folder != root and root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                return
            folder = folder.parent

    def _name_foreign(self) -> None:
        """Warn about the files in the folder that this run did not write (kept, never removed)."""
        foreign = list(self.kept)
        for dirpath, dirnames, filenames in os.walk(self.root):
            rel_dir = Path(dirpath).relative_to(self.root).as_posix()
            rel_dir = "" if rel_dir == "." else rel_dir + "/"
            # state folders and nested run folders (a part of this run with its own manifest) are not this run's files
            dirnames[:] = sorted(
                d
                for d in dirnames
                if not self._in_state(rel_dir + d) and next((Path(dirpath) / d).glob("posfair-run*.json"), None) is None
            )
            for name in sorted(filenames):
                rel = rel_dir + name
                if _records(name) or rel in self.files or rel in self.kept or self._in_state(rel):
                    continue
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # another writer's temporary file
                foreign.append(rel)
        if foreign:
            n, k = len(foreign), len(self.kept)
            changed = f"changed since posfair wrote {'it' if k == 1 else 'them'}"
            others = f"not made by posfair or by a version without {MANIFEST}"
            why = (
                others
                if not k
                else changed
                if k == n
                else f"{k} {changed}, the {'other' if n - k == 1 else 'others'} {others}"
            )
            shown = ", ".join(foreign[:5]) + (f", ... ({n - 5} more)" if n > 5 else "")
            warnings.warn(
                f"{self.root}: {_count(n, 'file')} {'was' if n == 1 else 'were'} not written by this {self.command} "
                f"and {'is' if n == 1 else 'are'} kept ({why}): {shown}; this run's files are listed in {self.manifest}",
                RunFolderWarning,
                stacklevel=user_stacklevel(),
            )
