"""Helpers shared by the command-line commands: progress bars, model loading, calibration options."""

from __future__ import annotations

from collections.abc import Sequence

from posfair.calibration.params import Calibration, parse_layers

#: the one help text of every command's ``--max-seq-length`` (the rule is posfair.model.token_limit)
MAX_SEQ_LENGTH_HELP = (
    "Token limit, special tokens included (default: the model's configured max_seq_length, "
    "256 for the bundled all-MiniLM-L6-v2; at most its position limit, 512 there). Recorded in each run's metadata."
)


def progress():
    """A rich progress bar with counts, elapsed and remaining time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )


def load_model_option(model: str | None, **kwargs):
    """Load ``--model`` (None or "bundled" = the bundled MiniLM) as a FairModel."""
    from posfair.model import load_model

    return load_model(None if model in (None, "", "bundled") else model, **kwargs)


def calibration_option(
    spec: str | None = None,
    basket_size: int | None = None,
    layers: str | None = None,
    strength: float | None = None,
) -> Calibration | None:
    """A Calibration from ``--calibration B,layers,alpha`` or the separate options (None if none given).

    Separate options fill in the defaults (B=128, last 50% of layers, strength 0.5)
    for what they do not name, and override the spec's fields when both are given.
    """
    if spec is None and basket_size is None and layers is None and strength is None:
        return None
    base = Calibration.parse(spec) if spec else Calibration()
    fields = base.to_dict()
    if basket_size is not None:
        fields["basket_size"] = basket_size
    if layers is not None:
        fields["layers"] = parse_layers(layers)
    if strength is not None:
        fields["strength"] = strength
    return Calibration.from_dict(fields)


def calibrations_option(specs: Sequence[str] | None) -> list[Calibration]:
    """Several ``B,layers,alpha`` specs (``default`` = the robust default ``128,0.5,0.5``)."""
    return [Calibration.parse(s) for s in (specs or [])]


def one_line_warnings():
    """A context in which every Python warning prints as one line ``warning: <message>`` on stderr.

    Library code warns with :mod:`warnings` (e.g. a damaged cache shard set aside,
    :class:`posfair.store.DamagedShardWarning`); a command shows each as one line.
    """
    import contextlib
    import sys
    import warnings

    @contextlib.contextmanager
    def _ctx():
        def show(message, category, filename, lineno, file=None, line=None):
            print(f"warning: {message}", file=sys.stderr, flush=True)

        with warnings.catch_warnings():
            warnings.showwarning = show
            yield

    return _ctx()
