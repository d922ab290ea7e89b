"""The error boundary of the command line: every problem ends as one line on stderr.

* A user mistake -- a bad option value or usage (the parser's errors), or a
  :class:`~posfair.runtime.errors.PosfairInputError` from a command or the library (a
  missing file, a corpus without a field, a store of other settings, ...) --
  prints ``error: <what>`` naming the file, option or value, and exits with 2.
* Anything else is a bug or an environment problem: one line
  ``error: unexpected <Type>: <message> (rerun with --debug for the traceback)``
  and exit code 1; ``posfair --debug COMMAND ...`` (or ``POSFAIR_DEBUG=1``) prints
  the traceback before that line.
* Memory running out (a ``MemoryError``, torch's "DefaultCPUAllocator: can't allocate
  memory", CUDA's "out of memory") prints ``error: memory ran out (...)`` with what to
  lower (the command's ``--batch-size`` and ``--max-seq-length``), exit code 1.
* An interruption (Ctrl-C) prints ``error: interrupted`` and exits with 130.

:class:`PosfairGroup` is the Typer group class of the ``posfair`` application; its
``main`` is the boundary, so ``posfair.cli.main()``, the ``posfair`` script and
``typer.testing.CliRunner().invoke(app, ...)`` all go through it.  Library
warnings print as one line ``warning: <message>`` (:func:`one_line_warnings`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from posfair.cli.help_text import HelpContext
from posfair.runtime.errors import PosfairInputError, PosfairReadError, PosfairWriteError

__all__ = [
    "PosfairGroup",
    "PosfairInputError",
    "input_error",
    "naming",
    "data_errors",
    "one_line_warnings",
    "EXIT_USER",
    "EXIT_BUG",
]

EXIT_USER = 2
EXIT_BUG = 1
#: a run that failed on its environment (a file it could not write or read), not on its input
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
DEBUG_HINT = "rerun with --debug for the traceback"

# the parser's exception classes, taken from typer's own BadParameter (typer >= 0.2x vendors click)
_PARSER_ERRORS = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
_UsageError: type[Exception] = _PARSER_ERRORS["UsageError"]
_ParserException: type[Exception] = _PARSER_ERRORS["ClickException"]
_LIST_HINT = "a list option takes comma-separated values, e.g. --lang en,de or --n 3,4"


def input_error(option: str, value: Any, message: str) -> PosfairInputError:
    """``PosfairInputError("--option value: message")`` (the value left out when None; quoted when it is
    empty or has leading or trailing white space, so the user sees it)."""
    shown = (
        ""
        if value is None
        else f" {value!r}"
        if isinstance(value, str) and (not value.strip() or value != value.strip())
        else f" {value}"
    )
    return PosfairInputError(f"{option}{shown}: {message}")


@contextlib.contextmanager
def naming(
    option: str, value: Any = None, *, errors: tuple[type[BaseException], ...] = (ValueError, OSError)
) -> Iterator[None]:
    """Run a library call on an option's value; its ValueError / OSError becomes one line naming the option.

    A message that already starts with the value (a file name: ``corpus.jsonl: line 3 ...``)
    names it well enough and is kept as it is.  A model that cannot be found
    (:class:`posfair.model.hub.ModelNotFound`) is named by its reason.
    """
    try:
        yield
    except (PosfairWriteError, PosfairReadError):  # a file the system would not let posfair write or read:
        raise  # not the option's fault
    except errors as exc:
        reason = getattr(exc, "reason", None)  # posfair.model.hub.ModelNotFound
        message = reason if isinstance(reason, str) else _message(exc)
        if value is not None and message.startswith(str(value)):
            raise PosfairInputError(message) from exc
        raise input_error(option, value, message) from exc


@contextlib.contextmanager
def data_errors(what: str | None = None) -> Iterator[None]:
    """Run a pipeline on what the user gave, naming that input in its refusals.

    The audit, tuner and benchmark builder refuse data that cannot serve the settings
    (too few topics or segment sets, nothing fits the token limit) with
    :class:`PosfairInputError` (exit 2); ``what`` (e.g. ``"--corpus x.jsonl"``) prefixes
    the message.  Any other exception is not about the input and reaches the boundary
    as unexpected (exit 1, ``--debug`` for the traceback).
    """
    try:
        yield
    except PosfairInputError as exc:
        if what and not str(exc).startswith(what):
            raise PosfairInputError(f"{what}: {one_line(str(exc))}") from exc
        raise


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename and not isinstance(exc, PosfairInputError):
        return f"{exc.filename}: {exc.strerror}"
    text = str(exc) or type(exc).__name__
    return text


def one_line(text: str) -> str:
    """``text`` as one line (a multi-line message joined with spaces)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _option_value(args: Sequence[str], opts: Sequence[str]) -> str | None:
    """The value given to an option on the command line, when it was given exactly once."""
    found = []
    for i, arg in enumerate(args):
        for opt in opts:
            if arg == opt and i + 1 < len(args):
                found.append(args[i + 1])
            elif opt.startswith("--") and arg.startswith(opt + "="):
                found.append(arg[len(opt) + 1 :])
    return found[0] if len(found) == 1 else None


def _usage_message(exc: Exception, args: Sequence[str]) -> str:
    """The parser's error as ``--option value: what is wrong`` (or its own sentence, lower-cased)."""
    param = getattr(exc, "param", None)
    opts = [o for o in getattr(param, "opts", []) or [] if o.startswith("-")]
    if type(exc).__name__ == "BadParameter" and opts:
        message = one_line(getattr(exc, "message", str(exc)))
        for prefix in ("Value error, ", "Assertion failed, "):  # pydantic's words around a validator's message
            message = message.replace(prefix, "")
        if message.startswith("Input should be "):
            message = "must be " + message[len("Input should be ") :]
        name = max(opts, key=len)
        value = _option_value(args, opts)
        return f"{name} {value}: {message}" if value is not None else f"{name}: {message}"
    message = one_line(exc.format_message()).rstrip(".")
    message = message[:1].lower() + message[1:]
    if message.startswith("got unexpected extra argument"):
        message += f" ({_LIST_HINT})"
    return message


def _debug_requested(args: Sequence[str]) -> bool:
    """``--debug`` among the options before the command name, or ``POSFAIR_DEBUG`` set."""
    if os.environ.get("POSFAIR_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    for arg in args:
        if not arg.startswith("-"):
            return False
        if arg == "--debug":
            return True
    return False


#: what an exception's message says when memory ran out (torch's CPU allocator, CUDA, the C library's ENOMEM)
_NO_MEMORY = ("can't allocate memory", "cannot allocate memory", "out of memory", "defaultcpuallocator")


def out_of_memory(exc: BaseException) -> BaseException | None:
    """The exception in ``exc``'s chain (itself, its cause or context) that says memory ran out: a MemoryError, or a
    RuntimeError / OSError whose message says so (torch raises RuntimeError, CUDA torch.OutOfMemoryError); else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MemoryError):
            return exc
        if isinstance(exc, (RuntimeError, OSError)) and any(m in str(exc).lower() for m in _NO_MEMORY):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _memory_message(exc: BaseException, args: Sequence[str], group: Any) -> str:
    """``memory ran out (<the error>): lower --batch-size (now 32) or --max-seq-length (now ...)``, naming the
    options the command has."""
    text = one_line(str(exc))
    if len(text) > 200:
        text = text[:197] + "..."
    lower = []
    params = {}
    if group is not None:
        name = next((a for a in args if not a.startswith("-")), None)
        command = group.commands.get(name) if name else None
        params = {o: p for p in getattr(command, "params", []) for o in getattr(p, "opts", [])}
    for option in ("--batch-size", "--max-seq-length"):
        if option in params:
            value = _option_value(args, [option])
            if value is None:
                default = params[option].default
                value = "the model's own" if default is None and option == "--max-seq-length" else default
            lower.append(f"{option} (now {value})" if value is not None else option)
    advice = f"lower {' or '.join(lower)}" if lower else "free memory or use a machine with more"
    return f"memory ran out ({type(exc).__name__}{': ' + text if text else ''}): {advice}"


def report(exc: BaseException, args: Sequence[str], debug: bool, group: Any = None) -> int:
    """Print ``exc`` as one ``error:`` line (a traceback first when ``debug`` and unexpected); the exit code.
    ``group``: the command group (to name the options of the command that ran out of memory)."""
    if type(exc).__name__ == "NoArgsIsHelpError":  # bare "posfair": the help (rich prints it itself), exit 0
        text = exc.format_message()
        if text.strip() and "Usage:" in text:
            from posfair.cli.terminal import say

            say(text)
        return 0
    if isinstance(exc, _UsageError):
        code, message = EXIT_USER, _usage_message(exc, args)
    elif isinstance(exc, PosfairInputError):
        code, message = EXIT_USER, one_line(str(exc))
    elif isinstance(exc, (PosfairWriteError, PosfairReadError)):
        code, message = EXIT_FAILED, one_line(str(exc))
    elif isinstance(exc, _ParserException):
        code, message = getattr(exc, "exit_code", EXIT_USER), one_line(exc.format_message())
    elif isinstance(exc, KeyboardInterrupt) or type(exc).__name__ == "Abort":
        code, message = EXIT_INTERRUPTED, "interrupted"
    elif out_of_memory(exc) is not None:
        code, message = EXIT_FAILED, _memory_message(out_of_memory(exc), args, group)
    else:
        code = EXIT_BUG
        message = f"unexpected {type(exc).__name__}: {one_line(str(exc))}" + ("" if debug else f" ({DEBUG_HINT})")
    sys.stdout.flush()
    if debug and code != EXIT_INTERRUPTED:  # --debug: the traceback of every error but the parser's
        if not isinstance(exc, _UsageError):
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    from posfair.cli.terminal import error

    error(message)
    return code


class PosfairGroup(TyperGroup):
    """The ``posfair`` command group; its :meth:`main` is the error boundary, its ``--help`` wrapped at white space
    only (:class:`posfair.cli.help_text.HelpContext`)."""

    context_class = HelpContext

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        from posfair.cli.aliases import deprecated_in, rewrite  # former option names, hidden from --help

        given = sys.argv[1:] if args is None else args
        _say_deprecated(deprecated_in(given))
        argv = rewrite(given)
        debug = _debug_requested(argv)
        try:
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
            if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into exit code 130
                from posfair.cli.terminal import error

                error("interrupted")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_BUG)
        except BaseException as exc:  # the boundary: everything becomes one line and an exit code
            code = report(exc, argv, debug, self)
        if standalone_mode:
            sys.exit(code)
        return code


def _say_deprecated(lines: list[str]) -> None:
    """A ``warning:`` line for each former option name the command line used, before the command runs."""
    if lines:
        from posfair.cli.terminal import warn

        for line in lines:
            warn(line)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _posfairs(category: type, filename: str) -> bool:
    """Is a warning posfair's own: a posfair warning class, or issued (at its stack level) from posfair's code.

    Another library's deprecation notice is never posfair's own, even when its stack level points into
    posfair (Ray's about an argument posfair passes): it asks posfair's developers to act, not the user.
    """
    if getattr(category, "__module__", "").startswith("posfair"):
        return True
    if issubclass(category, DeprecationWarning):
        return False
    try:
        return os.path.commonpath([os.path.abspath(filename), _PACKAGE_DIR]) == _PACKAGE_DIR
    except ValueError:  # another drive, or no file
        return False


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Within: every Python warning prints as one line ``warning: <message>`` on stderr.

    Library code warns with :mod:`warnings` (e.g. a damaged cache shard set aside,
    :class:`posfair.store.DamagedShardWarning`); a command shows each as one line.  Only posfair's own
    warnings are shown (a posfair warning class, or issued from posfair's code); another library's notices
    (deprecations inside sentence-transformers or transformers, which the user cannot act on) are shown
    only with ``--debug``.  posfair's log warnings (``logging``, logger ``posfair``) print the same way, through
    the terminal writer; one the command's own summary says (marked ``extra={"posfair_summary": True}``) is not
    said twice.
    """

    def show(message, category, filename, lineno, file=None, line=None):
        if not _posfairs(category, filename) and not _debug_requested(sys.argv[1:]):
            return  # another library's notice (e.g. a deprecation inside sentence-transformers): not the user's to act on
        from posfair.cli.terminal import warn

        warn(one_line(str(message)))

    with warnings.catch_warnings(), quiet_other_libraries(), _log_warnings_as_lines():
        warnings.showwarning = show
        yield


class _WarningLines(logging.Handler):
    """posfair's log records of level WARNING and above as ``warning: <message>`` lines of the terminal writer."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "posfair_summary", False):
            return  # the command's summary says it
        from posfair.cli.terminal import warn

        try:
            warn(one_line(record.getMessage()))
        except Exception:  # noqa: BLE001 -- logging must never end the command
            self.handleError(record)


@contextlib.contextmanager
def _log_warnings_as_lines() -> Iterator[None]:
    """Within: posfair's log warnings go through the terminal writer (not logging's bare last-resort line)."""
    log = logging.getLogger("posfair")
    handler, propagate = _WarningLines(), log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = propagate


@contextlib.contextmanager
def quiet_other_libraries() -> Iterator[None]:
    """Within (a command of the ``posfair`` process; not with ``--debug``): no progress bars of transformers
    ("Loading weights", "Writing model shards") or datasets ("Map", "Saving the dataset"): the commands show their
    own progress.  Downloads keep huggingface_hub's bars.

    Neither library has a per-call option for these bars (transformers' weight loading and ``save_pretrained``,
    datasets' ``map`` / ``save_to_disk`` read a module-level switch), so the switch is turned off here, in the
    command's process, when the library is imported (it is imported lazily, after ``--help``), and restored on
    exit.  posfair.load_model and FairModel.save turn transformers' bars off around themselves in a script too (``show_progress_bar=True`` keeps them).
    """
    if _debug_requested(sys.argv[1:]):
        yield
        return
    from posfair.runtime.post_import import when_imported

    state: dict[str, Any] = {"active": True, "restore": []}

    def transformers_off(logging: Any) -> None:
        if not state["active"] or not logging.is_progress_bar_enabled():
            return
        import huggingface_hub.utils as hub_utils

        hub_on = not hub_utils.are_progress_bars_disabled()
        logging.disable_progress_bar()  # (turns the hub's bars off too: back on for downloads)
        if hub_on:
            hub_utils.enable_progress_bars()
        state["restore"].append(logging.enable_progress_bar)

    def datasets_off(tqdm_module: Any) -> None:
        user_set = os.environ.get("HF_DATASETS_DISABLE_PROGRESS_BARS") is not None  # the user's choice stands
        if state["active"] and not user_set and not tqdm_module.are_progress_bars_disabled():
            tqdm_module.disable_progress_bars()
            state["restore"].append(tqdm_module.enable_progress_bars)

    when_imported("transformers.utils.logging", transformers_off)
    when_imported("datasets.utils.tqdm", datasets_off)
    try:
        yield
    finally:
        state["active"] = False
        for restore in state["restore"]:
            restore()
