"""The key index of a namespace: which shard and row holds a key, without a Python dict of every key.

``index.arrow`` (beside the shards, written atomically) is an Arrow IPC file of
three columns sorted by key hash: ``hash`` (uint64, SipHash-2-4 of the key's UTF-8
bytes with a fixed key, :func:`key_hashes`), ``shard`` and ``row`` (uint32).  Its
schema metadata lists the indexed shards (name, size, mtime, rows, dimension,
checksum, settings) and a sha256 of the three columns.  It is memory-mapped; a
lookup hashes the wanted keys, binary-searches them (``numpy.searchsorted``) and
compares the keys stored in the shard at the found rows (a hash collision is
never a wrong answer, only a longer walk).

**Checksum rule.**  A shard is fully verified (checksum over every byte, finite
values) before it enters the index: when it is new, or its size or modification
time differ from the index's record (or its inode: it was replaced), or the index is missing, unreadable or fails
its own checksum.  A shard the index records with the same size, mtime and inode was
verified when it was indexed and is trusted at open without reading it (only
``stat``), so opening a namespace costs ``O(shards)`` stats plus mapping the index.
:meth:`ShardSet.verify` (``Namespace.verify()``) verifies every shard again,
whatever the index says.  A shard failing a check is set aside (renamed
``.damaged-<n>``, with a warning) and its keys count as missing, so they are
computed again; a shard the operating system would not open (too many open files,
permission, an I/O error) is not damaged: :class:`~posfair.runtime.errors.PosfairReadError`
names it and the cause, and nothing is set aside.

**Open files.**  A shard holds no open file once its structure is read
(:class:`~posfair.store.shards.ShardFile`), and a :class:`ShardSet` keeps at most
``MAPPED_SHARDS`` shards mapped (the least recently used are dropped and mapped again
when next needed), so a namespace of any number of shards stays within the open-file
limit and the kernel's limit on memory maps (``vm.max_map_count``).  Checking shards
keeps only their key hashes, not the shards.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from posfair.files.atomic import atomic_path
from posfair.store.shards import ChangedShard, DamagedShard, ShardFile, reading, set_aside

__all__ = ["INDEX", "ShardSet", "key_hashes", "load_index"]

INDEX = "index.arrow"
INDEX_FORMAT = 1
_HASH = "siphash24:posfair-keyidx01"
_HASH_KEY = "posfair-keyidx01"  # 16 bytes, as SipHash needs
RECENT_LIMIT = 100_000  # keys of this process's new shards held in a dict before the index is rewritten
# shards a ShardSet keeps memory-mapped (least recently used dropped): each holds no open file, one memory map
# (the kernel allows ~65,000 per process: vm.max_map_count) and ~4 KB; re-mapping one costs ~0.4 ms
MAPPED_SHARDS = 4096


def key_hashes(keys: Sequence[str] | pa.Array) -> np.ndarray:
    """uint64 SipHash-2-4 of each key's UTF-8 bytes (vectorised; stable across runs and machines)."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        arr = keys.to_numpy(zero_copy_only=False)
    else:
        arr = np.asarray(list(keys), dtype=object)
    if not len(arr):
        return np.zeros(0, dtype=np.uint64)
    return pd.util.hash_array(arr, encoding="utf8", hash_key=_HASH_KEY, categorize=False).astype(np.uint64, copy=False)


def _arrays_sha(h: np.ndarray, s: np.ndarray, r: np.ndarray) -> str:
    d = hashlib.sha256()
    for a in (h, s, r):
        d.update(memoryview(np.ascontiguousarray(a)).cast("B"))
    return d.hexdigest()


class _Index:
    """A loaded (memory-mapped) or freshly built index."""

    def __init__(
        self, records: list[dict[str, Any]], h: np.ndarray, s: np.ndarray, r: np.ndarray, distinct: int, keep=None
    ):
        self.records, self.h, self.s, self.r, self.distinct = records, h, s, r, distinct
        self._keep = keep  # the memory map the arrays view

    def save(self, folder: Path) -> None:
        meta = {
            "format": INDEX_FORMAT,
            "hash": _HASH,
            "distinct": self.distinct,
            "shards": self.records,
            "sha256": _arrays_sha(self.h, self.s, self.r),
        }
        schema = pa.schema(
            [
                pa.field("hash", pa.uint64(), nullable=False),
                pa.field("shard", pa.uint32(), nullable=False),
                pa.field("row", pa.uint32(), nullable=False),
            ],
            metadata={b"posfair": json.dumps(meta, sort_keys=True).encode()},
        )
        batch = pa.record_batch([pa.array(self.h), pa.array(self.s), pa.array(self.r)], schema=schema)
        with atomic_path(folder / INDEX) as tmp:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                writer.write_batch(batch)


def load_index(folder: str | os.PathLike) -> _Index | None:
    """The namespace's index, memory-mapped, or None when it is missing, unreadable or fails its checksum."""
    path = Path(folder) / INDEX
    if not path.exists():
        return None
    try:
        with reading(path):  # too many open files, permission, an I/O error: an error, not a damaged index
            mm = pa.memory_map(str(path), "r")
    except FileNotFoundError:
        return None
    try:
        reader = pa.ipc.open_file(mm)
        meta = json.loads(reader.schema.metadata[b"posfair"])
        if meta.get("format") != INDEX_FORMAT or meta.get("hash") != _HASH or reader.num_record_batches != 1:
            return None
        b = reader.get_batch(0)
        h, s, r = (b.column(i).to_numpy(zero_copy_only=True) for i in range(3))
        if h.dtype != np.uint64 or s.dtype != np.uint32 or r.dtype != np.uint32:
            return None
        if _arrays_sha(h, s, r) != meta["sha256"]:
            return None
        records = list(meta["shards"])
        if len(s) and int(s.max()) >= len(records):
            return None
        return _Index(records, h, s, r, int(meta["distinct"]), keep=mm)
    except Exception:  # any damage: the index is derived data, rebuilt from the shards
        return None
    finally:
        mm.close()  # the file descriptor: the arrays keep the mapping


def _record(path: Path, shard: ShardFile) -> dict[str, Any]:
    st = path.stat()
    return {
        "name": path.name,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "inode": st.st_ino,
        "rows": shard.rows,
        "dim": shard.dim,
        "sha256": shard.sha256,
        "settings": shard.info["settings"],
    }


def unchanged(record: dict[str, Any], path: Path) -> bool:
    """The file at ``path`` has the size, mtime and inode the index recorded when it verified it."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return False
    return st.st_size == record["size"] and st.st_mtime_ns == record["mtime_ns"] and st.st_ino == record.get("inode")


class ShardSet:
    """The good shards of a namespace and the key index over them.

    ``records[i]`` describes shard ``i`` (files in name order); shards are opened
    (memory-mapped) on first use, at most ``MAPPED_SHARDS`` kept mapped (least recently
    used dropped; arrays already taken from a dropped shard stay valid: they keep their
    mapping).  Keys of shards added by this process since the
    index was built are held in a dict until :meth:`flush` merges them into the index
    (at the end of ``get_or_compute``, or every ``RECENT_LIMIT`` keys).
    """

    def __init__(self, folder: Path, index: _Index):
        self.folder = Path(folder)
        self.index = index
        self.records: list[dict[str, Any]] = list(index.records)
        self._files: OrderedDict[int, ShardFile] = OrderedDict()  # the mapped shards, least recently used first
        self._recent: dict[str, tuple[int, int]] = {}

    # ---------------------------------------------------------------- building
    @classmethod
    def build(
        cls, folder: Path, records: list[dict[str, Any]], old: _Index | None, fresh: dict[str, np.ndarray]
    ) -> ShardSet:
        """The set of ``records`` (in order): index entries of ``old`` reused for shards it recorded
        unchanged; ``fresh`` maps each just verified shard's name to its keys' hashes (:func:`key_hashes`,
        in row order), so no shard needs to stay open between its check and the index."""
        hs, ss, rs = [], [], []
        if old is not None and len(old.h):
            remap = np.full(len(old.records), -1, dtype=np.int64)
            pos = {rec["name"]: i for i, rec in enumerate(records) if rec["name"] not in fresh}
            for j, rec in enumerate(old.records):
                if rec["name"] in pos:
                    remap[j] = pos[rec["name"]]
            new_s = remap[old.s]
            keep = new_s >= 0
            hs.append(np.asarray(old.h)[keep])
            ss.append(new_s[keep].astype(np.uint32))
            rs.append(np.asarray(old.r)[keep])
        for i, rec in enumerate(records):
            if rec["name"] in fresh:
                hashes = fresh[rec["name"]]
                hs.append(hashes)
                ss.append(np.full(len(hashes), i, dtype=np.uint32))
                rs.append(np.arange(len(hashes), dtype=np.uint32))
        return cls._from_parts(folder, records, hs, ss, rs)

    @classmethod
    def _from_parts(cls, folder, records, hs, ss, rs) -> ShardSet:
        h = np.concatenate(hs) if hs else np.zeros(0, np.uint64)
        s = np.concatenate(ss) if ss else np.zeros(0, np.uint32)
        r = np.concatenate(rs) if rs else np.zeros(0, np.uint32)
        order = np.lexsort((r, s, h))  # by hash, then shard (the first shard holding a key wins), then row
        h, s, r = h[order], s[order], r[order]
        out = cls(folder, _Index(records, h, s, r, len(h)))
        out.index.distinct = len(h) - out._duplicates()
        return out

    def _losers(self) -> np.ndarray:
        """Index entries whose key an earlier entry holds too (the same key in two shards): lookups
        return the first (lowest shard, then row); these are never returned."""
        h = self.index.h
        same = np.flatnonzero(h[1:] == h[:-1])
        if not len(same):
            return np.zeros(0, dtype=np.int64)
        groups: dict[int, set[int]] = {}
        for i in same:
            groups.setdefault(int(h[i]), set()).update((int(i), int(i) + 1))
        out = []
        for pos in groups.values():
            seen: set[str] = set()
            for p in sorted(pos):  # entries of one hash are ordered by (shard, row)
                key = self._key_at(p)
                if key in seen:
                    out.append(p)
                seen.add(key)
        return np.asarray(sorted(out), dtype=np.int64)

    def _duplicates(self) -> int:
        return len(self._losers())

    def redundant_rows(self) -> np.ndarray:
        """Global row positions (shards in order, as ``Namespace.chunks`` yields them) that no lookup
        returns: second copies of a key stored in two shards (two writers computing the same text,
        a converted store).  Searches exclude them so a document is never listed twice.  Empty (and
        computed from the counts alone) when every stored row holds a distinct key."""
        self.flush()
        if len(self) == self.rows:
            return np.zeros(0, dtype=np.int64)
        starts = np.cumsum([0] + [int(rec["rows"]) for rec in self.records])
        keep = np.zeros(self.rows, dtype=bool)
        winner = np.ones(len(self.index.h), dtype=bool)
        winner[self._losers()] = False
        s = self.index.s[winner].astype(np.int64)
        keep[starts[s] + self.index.r[winner].astype(np.int64)] = True
        return np.flatnonzero(~keep)

    def _key_at(self, p: int) -> str:
        return self.file(int(self.index.s[p])).keys[int(self.index.r[p])].as_py()

    def save(self) -> None:
        """Write the index atomically (a read-only folder keeps it in memory only)."""
        try:
            self.index.save(self.folder)
        except OSError:
            pass

    # ---------------------------------------------------------------- files
    def file(self, i: int) -> ShardFile:
        """Shard ``i``, memory-mapped (opened and its structure checked on first use, or when it was dropped
        from the ``MAPPED_SHARDS`` most recently used)."""
        f = self._files.get(i)
        if f is not None:
            self._files.move_to_end(i)
        else:
            path = self.folder / self.records[i]["name"]
            try:
                f = ShardFile(path)
                if f.sha256 != self.records[i]["sha256"]:
                    raise DamagedShard("it is not the shard that was verified (its checksum changed)")
            except (DamagedShard, FileNotFoundError) as exc:
                if isinstance(exc, DamagedShard):
                    set_aside(path, str(exc))
                raise ChangedShard(
                    f"shard {path} changed since it was verified ({exc}); open the namespace again to recompute it"
                ) from None
            self._keep(i, f)
        return f

    def _keep(self, i: int, f: ShardFile) -> None:
        """Hold shard ``i`` mapped, dropping the least recently used beyond ``MAPPED_SHARDS``."""
        self._files[i] = f
        self._files.move_to_end(i)
        while len(self._files) > MAPPED_SHARDS:
            self._files.popitem(last=False)

    def __iter__(self) -> Iterator[tuple[int, ShardFile]]:
        for i in range(len(self.records)):
            yield i, self.file(i)

    @property
    def rows(self) -> int:
        return sum(int(rec["rows"]) for rec in self.records)

    # ---------------------------------------------------------------- lookups
    def __len__(self) -> int:
        return self.index.distinct + len(self._recent)

    def locate(self, keys: Sequence[str], vectors: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, row)`` of each key (int64 arrays; -1 where it is not stored).

        ``vectors``: a (len(keys) x dim) float32 array that receives the vector of each key found, copied
        while its shard is mapped to compare the keys (so a lookup maps each shard once, however few of
        them the set keeps mapped); the rows of keys not found are left as they are.
        """
        n = len(keys)
        shard = np.full(n, -1, dtype=np.int64)
        row = np.full(n, -1, dtype=np.int64)
        if not n:
            return shard, row
        H = self.index.h
        if len(H):
            want = key_hashes(keys)
            p = np.searchsorted(H, want)
            active = np.arange(n)
            while active.size:
                active = active[p[active] < len(H)]
                active = active[H[p[active]] == want[active]]
                if not active.size:
                    break
                s = self.index.s[p[active]].astype(np.int64)
                r = self.index.r[p[active]].astype(np.int64)
                eq = np.zeros(len(active), dtype=bool)
                order = np.argsort(s, kind="stable")
                bounds = np.flatnonzero(np.diff(s[order])) + 1
                for grp in np.split(order, bounds):
                    f = self.file(int(s[grp[0]]))
                    stored = f.keys.take(pa.array(r[grp])).to_pylist()
                    same = np.array([a == keys[active[g]] for a, g in zip(stored, grp, strict=True)], dtype=bool)
                    eq[grp] = same
                    if vectors is not None and same.any():
                        vectors[active[grp[same]]] = f.vectors[r[grp[same]]]
                shard[active[eq]] = s[eq]
                row[active[eq]] = r[eq]
                active = active[~eq]
                p[active] += 1
        if self._recent:
            late = []
            for i in np.flatnonzero(shard < 0):
                hit = self._recent.get(keys[i])
                if hit is not None:
                    shard[i], row[i] = hit
                    late.append(i)
            if vectors is not None and late:
                vectors[late] = self.gather(shard[late], row[late], vectors.shape[1])
        return shard, row

    def gather(self, shard: np.ndarray, row: np.ndarray, dim: int) -> np.ndarray:
        """Vectors at ``(shard, row)`` (all found), stacked in order (copies only those rows)."""
        out = np.empty((len(shard), dim), dtype=np.float32)
        if not len(shard):
            return out
        order = np.argsort(shard, kind="stable")
        bounds = np.flatnonzero(np.diff(shard[order])) + 1
        for grp in np.split(order, bounds):
            out[grp] = self.file(int(shard[grp[0]])).vectors[row[grp]]
        return out

    # ---------------------------------------------------------------- this process's shards
    def add(self, path: Path, keys: Sequence[str]) -> None:
        """A shard this process has just written (its checksum computed from the vectors in memory)."""
        f = ShardFile(path)
        i = len(self.records)
        self.records.append(_record(path, f))
        self._keep(i, f)
        found, _ = self.locate(keys)
        for r, (k, s) in enumerate(zip(keys, found, strict=True)):
            if s < 0 and k not in self._recent:
                self._recent[k] = (i, r)
        if len(self._recent) >= RECENT_LIMIT:  # keep the dict small: merge into the index arrays
            self.flush()

    def flush(self) -> None:
        """Merge the keys of this process's new shards into the index and write it."""
        if len(self.records) == len(self.index.records):
            return
        items = list(self._recent.items())
        hs = [np.asarray(self.index.h), key_hashes([k for k, _ in items])]
        ss = [np.asarray(self.index.s), np.array([v[0] for _, v in items], dtype=np.uint32)]
        rs = [np.asarray(self.index.r), np.array([v[1] for _, v in items], dtype=np.uint32)]
        h, s, r = np.concatenate(hs), np.concatenate(ss), np.concatenate(rs)
        order = np.lexsort((r, s, h))
        self.index = _Index(list(self.records), h[order], s[order], r[order], self.index.distinct + len(items))
        self._recent = {}
        self.save()

    def verify(self) -> list[Path]:
        """Verify every shard fully (checksum, finite values); set aside the damaged ones.  Returns
        the paths set aside (their keys stay missing until the namespace is opened again)."""
        bad = []
        for i, rec in enumerate(self.records):
            path = self.folder / rec["name"]
            try:
                f = ShardFile(path)
                f.verify()
                if f.sha256 != rec["sha256"]:
                    raise DamagedShard("it is not the shard that was verified (its checksum changed)")
            except DamagedShard as exc:
                set_aside(path, str(exc))
                bad.append(path)
                self._files.pop(i, None)
        return bad
