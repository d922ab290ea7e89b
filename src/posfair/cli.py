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

import typer

from posfair.cliutil import MAX_SEQ_LENGTH_HELP

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


def read_texts(path: Path, text_field: str = "text", id_field: str | None = None) -> tuple[list[str], list | None]:
    """Texts (and ids) from .txt (one text a line), .jsonl/.json (one record a line) or .parquet.

    Raises ValueError naming the file and the line (.txt, .jsonl; 1-based) or row
    (.parquet; 0-based) of the first unusable value: a missing field, a null, a
    non-string or an empty text.  An input without texts is refused too.
    """
    from posfair.io import check_texts

    if not path.exists():
        raise ValueError(f"input file {path} does not exist")
    if path.is_dir():
        raise ValueError(f"input {path} is a folder, not a file")
    suffix = path.suffix.lower()
    ids = None
    if suffix not in (".txt", ".jsonl", ".json", ".parquet"):
        raise ValueError(f"{path}: unsupported input type {suffix!r}: use .txt, .jsonl or .parquet")
    if suffix in (".txt", ".jsonl", ".json"):
        try:
            raw = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        # lines end at \n only (str.splitlines would also cut at form feeds, U+2028, ... inside a text)
        lines = [line[:-1] if line.endswith("\r") else line for line in raw.split("\n")]
    if suffix == ".txt":
        # trailing blank lines end the file; a blank line inside it is refused (output row i = line i + 1)
        while lines and not lines[-1].strip():
            lines.pop()
        texts = check_texts(lines, str(path), "text", list(range(1, len(lines) + 1)))
    elif suffix in (".jsonl", ".json"):
        records, numbers = [], []
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}: line {n} is not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}: line {n} is a JSON {type(rec).__name__}, not an object with a {text_field!r} field")
            for field in (text_field, id_field) if id_field else (text_field,):
                if field not in rec:
                    raise ValueError(f"{path}: line {n} has no {field!r} field")
            records.append(rec)
            numbers.append(n)
        texts = check_texts([r[text_field] for r in records], str(path), text_field, numbers)
        if id_field:
            ids = [r[id_field] for r in records]
    else:
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several error types for a file that is not Parquet
            raise ValueError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
        for field in (text_field, id_field) if id_field else (text_field,):
            if field not in df.columns:
                raise ValueError(f"{path}: no column {field!r} (columns: {list(df.columns)})")
        texts = check_texts(df[text_field].tolist(), str(path), text_field)
        if id_field:
            ids = df[id_field].tolist()
    return texts, ids


def _error(message: str) -> typer.Exit:
    """Print ``error: message`` on stderr; the Exit (code 2) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command()
def encode(
    input: Path = typer.Option(..., "--input", "-i", help=".txt (one text a line), .jsonl (a text field) or .parquet"),
    output: Path = typer.Option(..., "--output", "-o", help=".npy (float32 matrix) or .parquet (one row per text)"),
    model: str | None = typer.Option(None, "--model", "-m", help="hub id or folder; default: the bundled all-MiniLM-L6-v2"),
    calibration: str | None = typer.Option(None, "--calibration", help="B,layers,alpha, e.g. 128,0.5,0.5"),
    basket_size: int | None = typer.Option(None, "--basket-size", help="calibrate with this basket size"),
    layers: str | None = typer.Option(None, "--layers", help="calibrated layers: k (last k), 0.5 (last half), or 3+4+5"),
    strength: float | None = typer.Option(None, "--strength", help="calibration strength in [0, 1]"),
    text_field: str = typer.Option("text", help="field/column holding the text (.jsonl/.parquet)"),
    id_field: str | None = typer.Option(None, help="field/column to carry into a .parquet output"),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    normalize: bool = typer.Option(False, "--normalize/--no-normalize", help="L2-normalise the embeddings"),
    prompt: str | None = typer.Option(None, help="text prefix (e.g. a query instruction)"),
    pooling: str | None = typer.Option(None, help="override the pooling: cls, mean or lasttoken"),
    max_seq_length: int | None = typer.Option(None, "--max-seq-length", help=MAX_SEQ_LENGTH_HELP),
    device: str | None = typer.Option(None),
    trust_remote_code: bool = typer.Option(False, help="allow code shipped with the model"),
    cache: Path | None = typer.Option(None, help="embedding cache folder (kept); default: a temporary one next to the output"),
    chunk_size: int = typer.Option(512, help="texts per cached chunk (a killed run loses at most one chunk)"),
) -> None:
    """Embed texts, stock or calibrated. Resumable: rerun the same command after an interruption."""
    import numpy as np

    from posfair import cliutil
    from posfair.encoding import encode_cached, l2_normalize
    from posfair.io import atomic_save_npy, atomic_write_parquet
    from posfair.store import EmbeddingStore, embedding_namespace

    # everything the user gave is checked before the model is loaded
    if output.suffix.lower() not in (".npy", ".parquet"):
        raise _error(f"--output {output}: unsupported output type {output.suffix!r}: use .npy or .parquet")
    if output.is_dir():
        raise _error(f"--output {output} is an existing folder, not a file")
    blocked = next((p for p in output.parents if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise _error(f"--output {output}: {blocked} is a file, not a folder")
    if cache is not None and cache.exists() and not cache.is_dir():
        raise _error(f"--cache {cache} is a file, not a folder")
    try:
        cal = cliutil.calibration_option(calibration, basket_size, layers, strength)
    except ValueError as exc:
        raise _error(f"calibration options: {exc}") from None
    try:
        texts, ids = read_texts(input, text_field, id_field)
    except ValueError as exc:
        raise _error(str(exc)) from None
    fm = cliutil.load_model_option(
        model, device=device, trust_remote_code=trust_remote_code, pooling=pooling, max_seq_length=max_seq_length
    )
    if cal is not None:
        try:
            fm.transformer_module.resolve(cal)  # validate against the model before any work
        except ValueError as exc:
            raise _error(f"--calibration {cal.label()}: {exc}") from None
    cache_dir = cache if cache is not None else _temporary_cache(output)
    with cliutil.one_line_warnings():
        try:
            store = EmbeddingStore(cache_dir)
            embedding_namespace(store, fm.fingerprint, cal, prompt)  # checks the store's manifest and shards
        except ValueError as exc:
            raise _error(str(exc)) from None
        n_unique = len(set(texts))
        with cliutil.progress() as prog:
            task = prog.add_task("encoding", total=n_unique)  # encode_cached counts the cached texts first
            vectors = encode_cached(fm, texts, store, calibration=cal, prompt=prompt, batch_size=batch_size,
                                    chunk_size=chunk_size, progress=lambda k: prog.advance(task, k))  # fmt: skip
    if normalize:
        vectors = l2_normalize(vectors)
    if output.suffix.lower() == ".npy":
        atomic_save_npy(output, vectors.astype(np.float32))
    else:
        import pandas as pd

        df = pd.DataFrame({"embedding": list(vectors.astype(np.float32))})
        if ids is not None:
            df.insert(0, id_field, ids)
        atomic_write_parquet(output, df)
    if cache is None:
        _remove_temporary_cache(cache_dir)
    label = cal.label() if cal else "stock"
    typer.echo(f"wrote {len(texts)} embeddings ({vectors.shape[1]} dims, {label}) to {output}")


# the file that marks a cache folder posfair created for one ``encode`` output (and may delete)
_TEMPORARY_MARK = ".posfair-temporary-cache"


def _temporary_cache(output: Path) -> Path:
    """The cache folder of ``encode`` without ``--cache``: created by posfair next to the output.

    Its name is fixed (``.<output name>.posfair-cache``), so a rerun after an
    interruption resumes from it; it holds a marker file, and only a folder with
    that marker is ever reused or removed.  A folder of that name without the
    marker is not posfair's: it is left alone and a fresh one is made instead.
    """
    import tempfile

    output.parent.mkdir(parents=True, exist_ok=True)
    folder = output.parent / f".{output.name}.posfair-cache"
    if (folder / _TEMPORARY_MARK).is_file():
        return folder
    try:
        folder.mkdir()
    except FileExistsError:
        folder = Path(tempfile.mkdtemp(prefix=f".{output.name}.posfair-cache-", dir=output.parent))
    (folder / _TEMPORARY_MARK).write_text(f"temporary embedding cache of posfair encode for {output}; removed after success\n")
    return folder


def _remove_temporary_cache(folder: Path) -> None:
    """Remove a cache folder :func:`_temporary_cache` made (and nothing else)."""
    if (folder / _TEMPORARY_MARK).is_file():
        shutil.rmtree(folder, ignore_errors=True)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context, version: bool = typer.Option(False, "--version", help="print the version and exit")) -> None:
    from posfair.cliutil import one_line_warnings

    # every command prints library warnings (e.g. a damaged cache shard set aside) as one "warning: ..." line
    ctx.with_resource(one_line_warnings())
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
