"""The longest functions and the largest files of a source tree (standard library only).

A function's (or method's) length is ``end_lineno - lineno + 1`` of its ``def`` node: from the ``def`` line to its
last line, decorators not counted, nested functions counted both inside their parent and on their own (named
``outer.<locals>.inner``, as Python's ``__qualname__`` names them).  A file's size is its number of lines.

    python scripts/code_size.py src/posfair            # the ten longest functions, the five largest files
    python scripts/code_size.py src/posfair --functions 20 --files 10
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import NamedTuple


class Function(NamedTuple):
    lines: int
    file: str  # relative to the measured root, with forward slashes
    qualname: str
    lineno: int


def _functions(tree: ast.Module, file: str) -> list[Function]:
    found: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = prefix + child.name
                found.append(Function(child.end_lineno - child.lineno + 1, file, qualname, child.lineno))
                visit(child, qualname + ".<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def measure(root: Path) -> tuple[list[Function], list[tuple[int, str]]]:
    """Every function of every ``*.py`` under ``root``, longest first, and every file with its line count, largest
    first (ties by name)."""
    functions: list[Function] = []
    files: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        files.append((len(text.splitlines()), rel))
        functions.extend(_functions(ast.parse(text, filename=str(path)), rel))
    functions.sort(key=lambda f: (-f.lines, f.file, f.lineno))
    files.sort(key=lambda f: (-f[0], f[1]))
    return functions, files


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the source folder to measure, e.g. src/posfair")
    parser.add_argument("--functions", type=int, default=10, help="how many of the longest functions (default 10)")
    parser.add_argument("--files", type=int, default=5, help="how many of the largest files (default 5)")
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        parser.error(f"{args.root}: not a folder")
    functions, files = measure(args.root)
    total = sum(n for n, _ in files)
    print(f"{args.root}: {len(files)} files, {total} lines, {len(functions)} functions")
    print(f"\nthe {args.functions} longest functions (lines, def line to last line):")
    for f in functions[: args.functions]:
        print(f"  {f.lines:5d}  {f.file}:{f.qualname}")
    print(f"\nthe {args.files} largest files (lines):")
    for n, rel in files[: args.files]:
        print(f"  {n:5d}  {rel}")


if __name__ == "__main__":
    main()
