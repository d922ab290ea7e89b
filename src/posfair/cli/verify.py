"""``posfair verify``: check every byte of an embedding store, set damaged shards aside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from posfair.cli.errors import input_error


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
    bad = 0
    typer.echo(f"{'namespace':<26}{'shards':>8}{'rows':>12}{'keys':>12}{'dup rows':>10}{'damaged':>9}")
    for rec in results:
        name = Path(rec["namespace"]).name
        typer.echo(
            f"{name:<26}{rec['shards']:>8}{rec['rows']:>12,}{rec['keys']:>12,}{rec['duplicate_rows']:>10,}{len(rec['damaged']):>9}"
        )
        for path in rec["damaged"]:
            typer.echo(f"  set aside: {path}")
        if rec["error"]:
            typer.echo(f"  not checked: {rec['error']}")
        bad += len(rec["damaged"]) + bool(rec["error"])
    shards = sum(r["shards"] for r in results)
    rows = sum(r["rows"] for r in results)
    if bad:
        typer.echo(
            f"{sum(len(r['damaged']) for r in results)} damaged shard(s) set aside and "
            f"{sum(bool(r['error']) for r in results)} namespace(s) not checked; {shards} sound shards ({rows:,} rows)"
        )
        raise typer.Exit(1)
    typer.echo(f"all {shards} shards of {len(results)} namespace(s) verified ({rows:,} rows)")
