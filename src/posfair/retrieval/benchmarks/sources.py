"""Reading the rows of a published benchmark from a hub id, a local copy or in-memory data.

A local copy is a directory saved with ``datasets.save_to_disk``, a directory of
data files as on the hub, or a single parquet / json(l) file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from posfair.files.reading import is_local, looks_like_hub_id

__all__ = ["is_local", "read_splits", "check_fields", "source_name"]


def read_splits(source: Any, splits: Sequence[str]) -> list[dict]:
    """Rows of ``splits`` (those present, in order) from a hub id, a local copy or in-memory data."""
    import datasets  # heavy (pyarrow, fsspec): loaded only when a benchmark is read

    if isinstance(source, datasets.DatasetDict):
        present = [s for s in splits if s in source]
        if not present:
            raise ValueError(f"the dataset has splits {list(source)}, none of {list(splits)}")
        return [row for s in present for row in source[s].to_list()]
    if isinstance(source, datasets.Dataset):
        return source.to_list()
    if isinstance(source, pd.DataFrame):
        return source.to_dict("records")
    if isinstance(source, list):
        return list(source)
    if is_local(source):
        path = Path(source).expanduser()
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            return read_splits(datasets.load_from_disk(str(path)), splits)
        if path.is_file():
            suffix = path.suffix.lower()
            if suffix == ".parquet":
                return pd.read_parquet(path).to_dict("records")
            if suffix in (".jsonl", ".json"):
                return read_splits(datasets.load_dataset("json", data_files=str(path), split="train"), splits)
            raise ValueError(f"{path}: unsupported file type {suffix!r} (expected .parquet, .json or .jsonl)")
        loaded = datasets.load_dataset(str(path))
        return read_splits(loaded, splits)
    if isinstance(source, str) and looks_like_hub_id(source):
        return [row for s in splits for row in _hub_split(source, s)]
    raise FileNotFoundError(f"{source!r} is neither an existing local path nor a hub dataset id")


def _hub_split(repo_id: str, split: str) -> list[dict]:
    import datasets  # heavy: see read_splits

    return datasets.load_dataset(repo_id, split=split).to_list()


def check_fields(rows: list[dict], required: Iterable[str], what: str) -> None:
    """ValueError naming ``what`` unless there are rows and the first has every required field."""
    if not rows:
        raise ValueError(f"{what}: no rows")
    missing = [f for f in required if f not in rows[0]]
    if missing:
        raise ValueError(f"{what}: missing field(s) {missing}; found {sorted(rows[0])}")


def source_name(source: Any) -> str:
    """How a benchmark's ``meta`` records its source: the path or hub id, else ``"in-memory"``."""
    return str(source) if isinstance(source, (str, Path)) else "in-memory"
