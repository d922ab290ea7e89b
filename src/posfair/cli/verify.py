"""``posfair verify``: check every byte of an embedding store, set damaged shards aside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posfair.cli.error_boundary import input_error
from posfair.cli.terminal import say, table
from posfair.cli.terminal_tables import plural


def store_folder(path: Path) -> Path:
    """STORE: an existing folder holding posfair namespaces (or one namespace folder); nothing is created."""
    if not path.exists():
        raise input_error("STORE", path, "no such folder")
    if not path.is_dir():
        raise input_error("STORE", path, "is a file, not an embedding store folder")
    if not (path / "meta.json").is_file() and not any(path.glob("*/meta.json")):
        raise input_error(
            "STORE", path, "is not a posfair embedding store (no namespace folder with a meta.json in it)"
        )
    return path


def verify(
    store: Annotated[
        Path,
        typer.Argument(
            metavar="STORE",
            help="An embedding store folder (what --cache / posfair embed --out name), or one namespace folder in it.",
            show_default=False,
        ),
    ],
) -> None:
    """Verify every shard of an embedding store: checksums over every byte, finite values, settings, duplicate keys.

    A damaged shard is renamed *.damaged-<n> beside it (never deleted) and named in a
    warning; the next command that needs its vectors computes them again.  Exit code 0 when
    every shard is sound, 1 when a shard was set aside or a namespace could not be checked.
    """
    store_folder(store)
    from posfair.store import verify_store

    results = verify_store(store)
    header = ["namespace", "shards", "rows", "keys", "dup rows", "damaged", "what"]
    rows = [
        [Path(r["namespace"]).name, f"{r['shards']:,}", f"{r['rows']:,}", f"{r['keys']:,}", f"{r['duplicate_rows']:,}",
         f"{len(r['damaged']):,}", describe_namespace(Path(r["namespace"]))]
        for r in results
    ]  # fmt: skip
    table("", header, rows)
    bad = 0
    for rec in results:
        name = Path(rec["namespace"]).name
        for path in rec["damaged"]:
            say(f"{name}: set aside: {path}")
        if rec["error"]:
            say(f"{name}: not checked: {rec['error']}")
        bad += len(rec["damaged"]) + bool(rec["error"])
    shards = sum(r["shards"] for r in results)
    rows_total = sum(r["rows"] for r in results)
    if bad:
        say(
            f"{plural(sum(len(r['damaged']) for r in results), 'damaged shard')} set aside and "
            f"{plural(sum(bool(r['error']) for r in results), 'namespace')} not checked; "
            f"{plural(shards, 'sound shard')} ({plural(rows_total, 'row')})"
        )
        raise typer.Exit(1)
    say(f"all {plural(shards, 'shard')} of {plural(len(results), 'namespace')} verified ({plural(rows_total, 'row')})")


def describe_namespace(folder: Path) -> str:
    """A namespace in words from its manifest: what it holds, the calibration by its label, the model's fingerprint
    (the store keys namespaces by these hashes; this is what they stand for)."""
    import json

    from posfair.calibration import Calibration

    try:
        manifest = json.loads((folder / "manifest.json").read_text())
        meta = manifest.get("namespace") or {}
        cal = manifest.get("calibration")
        kind = meta.get("kind", "embedding")
        parts = [kind, f"model {str(manifest.get('fingerprint') or meta.get('model', '?'))[:12]}"]
        if "calibration" in manifest or "calibration" in meta:
            parts.append("stock" if not cal else Calibration.from_dict(cal).label())
        if manifest.get("prompt"):
            parts.append(f"prompt {manifest['prompt']!r}")
        return ", ".join(parts)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return "(no readable manifest)"
