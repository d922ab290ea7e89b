"""Former option names, kept working but hidden from ``--help`` (scripts written against them still run).

Each command's table maps a former spelling to the option's one name; :func:`rewrite` turns a command line's
former spellings into the current ones before it is parsed (``--langs en`` and ``--langs=en`` alike), so a
refusal names the option as ``--help`` shows it.  A former name in :data:`DEPRECATED` is also said, in one
``warning:`` line naming the new one (:func:`deprecated_in`), so that a script's author learns it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ALIASES", "DEPRECATED", "deprecated_in", "rewrite"]

_LANGS = {"--langs": "--lang"}  # one spelling for languages, one or a list (issue 40 item 8)

#: command -> {former name: current name}
ALIASES: dict[str, dict[str, str]] = {
    "audit": _LANGS,
    "attention": _LANGS,
    "estimate-prior": _LANGS,
    "build-benchmark": _LANGS,
    "embed": {**_LANGS, "--max-tokens": "--max-batch-tokens"},
    "retrieval": _LANGS,
    "sweep": _LANGS,
    "tune": {**_LANGS, "--trailing-policies": "--trailing", "--strength-schedules": "--schedule"},
}

#: command -> the former names a use of which is warned about (the token budget: one name in embed and serve)
DEPRECATED: dict[str, frozenset[str]] = {"embed": frozenset({"--max-tokens"})}


def _command_words(argv: Sequence[str], root_flags: Sequence[str]) -> tuple[str | None, list[str]]:
    """The command a command line runs (None: none with aliases) and the words after it, up to ``--``."""
    args = list(argv)
    i = 0
    while i < len(args) and args[i] in root_flags:
        i += 1
    if i >= len(args) or args[i] not in ALIASES:
        return None, []
    rest = args[i + 1 :]
    return args[i], rest[: rest.index("--")] if "--" in rest else rest


def deprecated_in(argv: Sequence[str], root_flags: Sequence[str] = ("--debug", "--version")) -> list[str]:
    """One line for each deprecated former name ``argv`` uses: ``--max-tokens is deprecated: use ...``."""
    command, words = _command_words(argv, root_flags)
    used = {w.partition("=")[0] for w in words} & DEPRECATED.get(command or "", frozenset())
    return [f"{old} is deprecated: use {ALIASES[command][old]} (same meaning)" for old in sorted(used)]


def rewrite(argv: Sequence[str], root_flags: Sequence[str] = ("--debug", "--version")) -> list[str]:
    """``argv`` (the words after ``posfair``) with the command's former option names replaced by the current ones."""
    args = list(argv)
    i = 0
    while i < len(args) and args[i] in root_flags:
        i += 1
    if i >= len(args) or args[i] not in ALIASES:
        return args
    table = ALIASES[args[i]]
    out = args[: i + 1]
    for pos, word in enumerate(args[i + 1 :], start=i + 1):
        if word == "--":  # everything after is an argument, not an option
            out += args[pos:]
            break
        name, eq, value = word.partition("=")
        out.append(table[name] + eq + value if name in table else word)
    return out
