"""``posfair encode``: embed the texts of a file, stock or calibrated, into a .npy or .parquet file."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from posfair.cli import checks
from posfair.cli.options import (
    BasketSize,
    BatchSize,
    CalibrationLayers,
    CalibrationOption,
    Device,
    MaxSeqLength,
    Model,
    OutFile,
    Pooling,
    Prompt,
    Strength,
    TemporaryCache,
    TextField,
    TrustRemoteCode,
)
from posfair.cli.parsers import integer

OUTPUT_TYPES = (".npy", ".parquet")


def encode(
    input: Annotated[
        Path,
        typer.Option(
            "--corpus",
            "-c",
            "--input",
            "-i",
            metavar="FILE",
            help="The texts: .txt (one text a line), .jsonl (one record a line) or .parquet (--input / -i: the "
            "same option under its former name).",
        ),
    ],
    out: OutFile,
    model: Model = None,
    calibration: CalibrationOption = None,
    basket_size: BasketSize = None,
    layers: CalibrationLayers = None,
    strength: Strength = None,
    text_field: TextField = "text",
    id_field: Annotated[
        str | None,
        typer.Option(
            "--id-field",
            metavar="FIELD",
            help="Field / column to carry into a .parquet output (.jsonl / .parquet input).",
        ),
    ] = None,
    batch_size: BatchSize = 32,
    normalize: Annotated[bool, typer.Option("--normalize/--no-normalize", help="L2-normalise the embeddings.")] = False,
    prompt: Prompt = None,
    pooling: Pooling = None,
    max_seq_length: MaxSeqLength = None,
    device: Device = None,
    trust_remote_code: TrustRemoteCode = False,
    cache: TemporaryCache = None,
    chunk_size: Annotated[
        int,
        typer.Option(
            "--chunk-size",
            parser=integer(1),
            metavar="N",
            help="Texts per cached chunk (a killed run loses at most one chunk).",
        ),
    ] = 512,
) -> None:
    """Embed texts, stock or calibrated. Resumable: rerun the same command after an interruption."""
    options = EncodeOptions(
        input=input,
        out=out,
        model=checks.ModelOptions(
            model, max_seq_length=max_seq_length, pooling=pooling, trust_remote_code=trust_remote_code, device=device
        ),
        calibration=checks.calibration(calibration, basket_size, layers, strength),
        text_field=text_field,
        id_field=id_field,
        batch_size=batch_size,
        normalize=normalize,
        prompt=prompt,
        cache=cache,
        chunk_size=chunk_size,
    )
    encode_run(options)


@dataclasses.dataclass(frozen=True)
class EncodeOptions:
    """Everything ``posfair encode`` runs with, built once by the command and passed down as one value: an
    ``--id-field`` the input or output cannot hold is refused when it is made, the output file, the cache folder
    and the model's source by :meth:`checked`, before anything is read or written.  ``calibration``: the
    Calibration of ``--calibration`` with ``--basket-size``, ``--layers``, ``--strength`` (STOCK when none)."""

    input: Path
    out: Path
    model: checks.ModelOptions
    calibration: Any
    text_field: str = "text"
    id_field: str | None = None
    batch_size: int = 32
    normalize: bool = False
    prompt: str | None = None
    cache: Path | None = None
    chunk_size: int = 512

    def __post_init__(self) -> None:
        from posfair.cli.error_boundary import input_error

        if self.id_field is not None and self.out.suffix.lower() != ".parquet":
            raise input_error(
                "--id-field", self.id_field, f"ids go into a .parquet output; --out {self.out} is {self.out.suffix}"
            )
        if self.id_field is not None and self.input.suffix.lower() == ".txt":
            raise input_error(
                "--id-field", self.id_field, f"a .txt input ({self.input}) has no fields; use .jsonl or .parquet"
            )

    def checked(self) -> EncodeOptions:
        """These options once the output file, the cache folder and the model's source and device are checked."""
        checks.output_file(self.out, OUTPUT_TYPES)
        checks.cache_folder(self.cache)
        self.model.checked()
        return self


def encode_run(options: EncodeOptions) -> None:
    """Check everything, read the texts, load the model and embed them (into a temporary cache without --cache)."""
    from posfair.files.reading import read_texts

    # everything the user gave is checked before the heavy imports, the model or anything is written
    o = options.checked()
    texts, ids = read_texts(o.input, o.text_field, o.id_field)  # PosfairInputError naming the file and line
    # the encoder (torch, transformers) is imported only now, when the command runs (--help and mistakes stay fast)
    fm = checks.load_model(o.model)
    checks.check_calibrations(fm, [o.calibration])
    temporary = TemporaryCacheFolder(o.out) if o.cache is None else None
    try:
        _encode_into(fm, texts, ids, o, o.cache if o.cache is not None else temporary.path)
        if temporary is not None:
            temporary.remove()
    finally:
        if temporary is not None:
            temporary.release()  # a failed run keeps the folder (a rerun resumes from it) and lets go of its lock


def _encode_into(fm, texts, ids, options: EncodeOptions, cache_dir) -> None:
    import numpy as np

    from posfair.cli.terminal_progress import progress_bars
    from posfair.encoding import encode_cached, l2_normalize
    from posfair.files.atomic import atomic_save_npy, atomic_write_parquet
    from posfair.store import EmbeddingStore, embedding_namespace, text_key

    o, cal, out, prompt = options, options.calibration, options.out, options.prompt

    store = EmbeddingStore(cache_dir)
    ns = embedding_namespace(store, fm.fingerprint, cal, prompt)  # checks the store's manifest and shards
    distinct = len(set(texts))
    cached = distinct - len(ns.missing(text_key(t) for t in texts))
    with progress_bars() as bar:
        tick = bar("encoding", len(set(texts)))  # encode_cached counts the cached texts first
        vectors = encode_cached(
            fm,
            texts,
            store,
            calibration=cal,
            prompt=prompt,
            batch_size=o.batch_size,
            chunk_size=o.chunk_size,
            progress=tick,
        )
    if o.normalize:
        vectors = l2_normalize(vectors)
    if out.suffix.lower() == ".npy":
        atomic_save_npy(out, vectors.astype(np.float32))
    else:
        import pandas as pd

        df = pd.DataFrame({"embedding": list(vectors.astype(np.float32))})
        if ids is not None:
            df.insert(0, o.id_field, ids)
        atomic_write_parquet(out, df)
    label = cal.label()
    if cal.label() != "stock":  # say how many texts the calibration changed: a no-op is not a calibrated result
        cov = fm.calibration_coverage(list(dict.fromkeys(texts)), cal, prompt=prompt)
        label = (
            f"{label}: {cov.calibrated} of {cov.total} distinct texts calibrated"
            if cov.calibrated
            else f"stock: {label} calibrated none of the {cov.total} distinct texts (none is longer than one basket)"
        )
    reused = f"; {cached} of {distinct} distinct texts from the cache {cache_dir}" if cached else ""
    from posfair.cli.terminal import say

    say(f"wrote {len(texts)} embeddings ({vectors.shape[1]} dims, {label}{reused}) to {out}")


# the file that marks a cache folder posfair created for one ``encode`` output (and may delete)
_TEMPORARY_MARK = ".posfair-temporary-cache"


class TemporaryCacheFolder:
    """The cache folder of ``encode`` without ``--cache``: created by posfair next to the output.

    Its name is fixed (``.<output name>.posfair-cache``), so a rerun after an interruption
    resumes from it; it holds a marker file, and only a folder with that marker is ever
    reused or removed.  A folder of that name without the marker is not posfair's (or is
    being made by another run this instant): it is left alone and ``.<output name>.posfair-cache-<random>``
    is used instead (an earlier one of those with the marker is resumed from).

    Runs writing the same output at the same time share the folder safely (the store takes
    concurrent writers): each holds a shared lock on the marker while it uses the folder,
    and a finished run removes the folder only when it can take the lock exclusively, i.e.
    when no other run uses it (the last one out removes it).  A run that finds the marker
    gone after its lock was granted (removed by the run that just finished) starts again.
    """

    def __init__(self, output: Path):
        output.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(20):
            folder = output.parent / f".{output.name}.posfair-cache"
            try:
                folder.mkdir()
            except FileExistsError:
                if not (folder / _TEMPORARY_MARK).is_file():  # not posfair's: an earlier fallback folder, or a new one
                    marked = sorted(
                        p.parent for p in output.parent.glob(f".{output.name}.posfair-cache-*/{_TEMPORARY_MARK}")
                    )
                    folder = (
                        marked[0]
                        if marked
                        else Path(tempfile.mkdtemp(prefix=f".{output.name}.posfair-cache-", dir=output.parent))
                    )
            mark = folder / _TEMPORARY_MARK
            try:
                fd = os.open(mark, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:  # removed by a run that just finished: start again
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                same = os.stat(mark).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            if os.fstat(fd).st_size == 0:
                os.write(
                    fd, f"temporary embedding cache of posfair encode for {output}; removed after success\n".encode()
                )
            self.path, self._fd = folder, fd
            return
        raise RuntimeError(f"could not take a temporary cache folder next to {output}")

    def release(self) -> None:
        """Let go of the lock (the folder stays); done by :meth:`remove` too."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def remove(self) -> bool:
        """Remove the folder when no other run uses it (True), else leave it to the last one (False)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.release()
            return False
        try:
            if (self.path / _TEMPORARY_MARK).is_file():
                shutil.rmtree(self.path, ignore_errors=True)
        finally:
            self.release()
        return True
