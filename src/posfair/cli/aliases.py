"""Former option names, kept working but hidden from ``--help`` (scripts written against them still run).

Each command's table maps a former spelling to the option's one name; :func:`rewrite` turns a command line's
former spellings into the current ones before it is parsed (``--langs en`` and ``--langs=en`` alike), so a
refusal names the option as ``--help`` shows it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["ALIASES", "rewrite"]

_LANGS = {"--langs": "--lang"}  # one spelling for languages, one or a list (issue 40 item 8)

#: command -> {former name: current name}
ALIASES: dict[str, dict[str, str]] = {
    "audit": _LANGS,
    "attention": _LANGS,
    "estimate-prior": _LANGS,
    "build-benchmark": _LANGS,
    "embed": _LANGS,
    "retrieval": _LANGS,
    "sweep": _LANGS,
    "tune": {**_LANGS, "--trailing-policies": "--trailing", "--strength-schedules": "--schedule"},
}


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
