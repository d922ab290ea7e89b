"""The ``posfair`` command line.

``posfair encode`` lives here; the other commands come from their areas
(``posfair.fairness.cli``: audit, demo; ``posfair.fairness.attention_cli``:
attention; ``posfair.retrieval.cli``: retrieval, sweep, build-benchmark) and
are merged into one application.
"""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(
    name="posfair",
    help="Measure and repair positional bias in text-embedding models.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)

AREA_MODULES = (
    "posfair.fairness.cli",
    "posfair.fairness.attention_cli",
    "posfair.retrieval.cli",
    "posfair.tuning.cli",
    "posfair.distributed.cli",
)


def read_texts(path: Path, text_field: str = "text", id_field: Optional[str] = None) -> tuple[list[str], Optional[list]]:
    """Texts (and ids) from .txt (one text a line), .jsonl/.json (one record a line) or .parquet."""
    if not path.exists():
        raise typer.BadParameter(f"input file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    ids = None
    if suffix == ".txt":
        texts = [line.rstrip("\n") for line in path.read_text(encoding="utf-8").splitlines()]
        texts = [t for t in texts if t.strip()]
    elif suffix in (".jsonl", ".json"):
        records = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise typer.BadParameter(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
        missing = [i for i, r in enumerate(records, start=1) if not isinstance(r, dict) or text_field not in r]
        if missing:
            raise typer.BadParameter(f"{path}: {len(missing)} records have no {text_field!r} field (first: record {missing[0]})")
        texts = [str(r[text_field]) for r in records]
        if id_field:
            ids = [r.get(id_field) for r in records]
    elif suffix == ".parquet":
        import pandas as pd

        df = pd.read_parquet(path)
        if text_field not in df.columns:
            raise typer.BadParameter(f"{path}: no column {text_field!r} (columns: {list(df.columns)})")
        texts = df[text_field].astype(str).tolist()
        if id_field:
            if id_field not in df.columns:
                raise typer.BadParameter(f"{path}: no column {id_field!r}")
            ids = df[id_field].tolist()
    else:
        raise typer.BadParameter(f"unsupported input type {suffix!r}: use .txt, .jsonl or .parquet")
    empty = [i for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise typer.BadParameter(f"{path}: {len(empty)} empty texts (first: row {empty[0]})")
    return texts, ids


@app.command()
def encode(
    input: Path = typer.Option(..., "--input", "-i", help=".txt (one text a line), .jsonl (a text field) or .parquet"),
    output: Path = typer.Option(..., "--output", "-o", help=".npy (float32 matrix) or .parquet (one row per text)"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="hub id or folder; default: the bundled all-MiniLM-L6-v2"),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="B,layers,alpha, e.g. 128,0.5,0.5"),
    basket_size: Optional[int] = typer.Option(None, "--basket-size", help="calibrate with this basket size"),
    layers: Optional[str] = typer.Option(None, "--layers", help="calibrated layers: k (last k), 0.5 (last half), or 3+4+5"),
    strength: Optional[float] = typer.Option(None, "--strength", help="calibration strength in [0, 1]"),
    text_field: str = typer.Option("text", help="field/column holding the text (.jsonl/.parquet)"),
    id_field: Optional[str] = typer.Option(None, help="field/column to carry into a .parquet output"),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    normalize: bool = typer.Option(False, "--normalize/--no-normalize", help="L2-normalise the embeddings"),
    prompt: Optional[str] = typer.Option(None, help="text prefix (e.g. a query instruction)"),
    pooling: Optional[str] = typer.Option(None, help="override the pooling: cls, mean or lasttoken"),
    max_seq_length: Optional[int] = typer.Option(None, help="token limit (at most the model's)"),
    device: Optional[str] = typer.Option(None),
    trust_remote_code: bool = typer.Option(False, help="allow code shipped with the model"),
    cache: Optional[Path] = typer.Option(None, help="embedding cache folder (kept); default: a temporary one next to the output"),
    chunk_size: int = typer.Option(512, help="texts per cached chunk (a killed run loses at most one chunk)"),
) -> None:
    """Embed texts, stock or calibrated. Resumable: rerun the same command after an interruption."""
    import numpy as np

    from posfair import cliutil
    from posfair.io import atomic_save_npy, atomic_write_parquet
    from posfair.store import EmbeddingStore, embedding_namespace, encode_cached, text_key

    if output.suffix.lower() not in (".npy", ".parquet"):
        raise typer.BadParameter(f"unsupported output type {output.suffix!r}: use .npy or .parquet")
    cal = cliutil.calibration_option(calibration, basket_size, layers, strength)
    texts, ids = read_texts(input, text_field, id_field)
    fm = cliutil.load_model_option(model, device=device, trust_remote_code=trust_remote_code, pooling=pooling, max_seq_length=max_seq_length)
    if cal is not None:
        fm.transformer_module.resolve(cal)  # validate against the model before any work
    cache_dir = cache or output.with_name(output.name + ".cache")
    store = EmbeddingStore(cache_dir)
    ns = embedding_namespace(store, fm.fingerprint, cal, prompt)
    n_unique = len(set(texts))
    with cliutil.progress() as prog:
        task = prog.add_task("encoding", total=n_unique, completed=n_unique - len(ns.missing([text_key(t) for t in texts])))
        vectors = encode_cached(fm, texts, store, calibration=cal, prompt=prompt, batch_size=batch_size,
                                chunk_size=chunk_size, progress=lambda k: prog.advance(task, k))  # fmt: skip
    if normalize:
        vectors = vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)
    if output.suffix.lower() == ".npy":
        atomic_save_npy(output, vectors.astype(np.float32))
    else:
        import pandas as pd

        df = pd.DataFrame({"embedding": list(vectors.astype(np.float32))})
        if ids is not None:
            df.insert(0, id_field, ids)
        atomic_write_parquet(output, df)
    if cache is None:
        shutil.rmtree(cache_dir, ignore_errors=True)
    label = cal.label() if cal else "stock"
    typer.echo(f"wrote {len(texts)} embeddings ({vectors.shape[1]} dims, {label}) to {output}")


@app.callback(invoke_without_command=True)
def _root(version: bool = typer.Option(False, "--version", help="print the version and exit")) -> None:
    if version:
        from posfair import __version__

        typer.echo(f"posfair {__version__}")
        raise typer.Exit()


def _mount_areas() -> None:
    have = {c.name or (c.callback.__name__ if c.callback else None) for c in app.registered_commands}
    for name in AREA_MODULES:
        sub = importlib.import_module(name).app
        for cmd in sub.registered_commands:
            cname = cmd.name or cmd.callback.__name__.replace("_", "-")
            if cname not in have:
                app.registered_commands.append(cmd)
                have.add(cname)


_mount_areas()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
