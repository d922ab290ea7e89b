"""scripts/code_size.py: the longest function it reports on src/posfair is the longest, counted without ast."""

import importlib
import importlib.util
import inspect
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "posfair"


def _script():
    spec = importlib.util.spec_from_file_location("code_size", ROOT / "scripts" / "code_size.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _def_lengths(text: str) -> list[int]:
    """Each def's lines, from its ``def`` line to its last token, by the tokenizer's INDENT and DEDENT (no ast)."""
    lengths, open_defs, depth, last_row, header_done = [], [], 0, 0, False
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NL, tokenize.COMMENT):
            continue
        if header_done and tok.type != tokenize.INDENT:  # a one-line def: no block follows its header
            lengths.append(last_row - open_defs.pop()[0] + 1)
        header_done = False
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
            while open_defs and open_defs[-1][1] == depth:  # the block the def opened has closed
                lengths.append(last_row - open_defs.pop()[0] + 1)
        elif tok.type == tokenize.NEWLINE:
            header_done = bool(open_defs) and open_defs[-1][2]
            if header_done:
                open_defs[-1] = (*open_defs[-1][:2], False)
        elif tok.type != tokenize.ENDMARKER:
            if tok.type == tokenize.NAME and tok.string == "def":
                open_defs.append((tok.start[0], depth, True))  # row, depth, header still open
            last_row = tok.end[0]
    return lengths


def test_the_longest_function_reported_is_the_longest(capsys):
    _script().main([str(SRC), "--functions", "1", "--files", "1"])
    lines, where = re.search(r"^\s+(\d+)\s+(\S+)$", capsys.readouterr().out, re.M).groups()
    file, qualname = where.split(":")
    obj = importlib.import_module("posfair." + file.removesuffix(".py").replace("/", "."))
    for part in qualname.split("."):
        obj = getattr(obj, part)
    source, _ = inspect.getsourcelines(inspect.unwrap(obj))
    body = next(i for i, line in enumerate(source) if re.match(r"\s*(async\s+)?def\s", line))  # decorators left out
    assert len(source) - body == int(lines)
    longest = max(n for path in SRC.rglob("*.py") for n in _def_lengths(path.read_text(encoding="utf-8")))
    assert longest == int(lines)
