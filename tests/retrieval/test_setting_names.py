"""Along the retrieval path a name says what it holds (issue 50, item 3): a result's one name is its ``setting``, a
query group's name a ``group``, a length bucket's a ``bucket``; no variable, parameter or property there is a bare
``label`` (which meant each of those, and a calibration's ``label()``, in turn)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

import posfair.retrieval as retrieval_package
from posfair.retrieval.groups import POSIR_BUCKETS, posir_length_bucket
from posfair.retrieval.late import LateChunking
from posfair.retrieval.metrics import group_scores, posir_bucket_scores

ROOT = Path(retrieval_package.__file__).parent
CLI = Path(retrieval_package.__file__).parent.parent / "cli"
#: the retrieval path: the package, and the commands' code that runs it
PATH = sorted(ROOT.rglob("*.py")) + [CLI / "runs.py", CLI / "retrieval.py", CLI / "sweep.py"]


def bare_labels(path: Path) -> list[str]:
    """Where ``path`` binds or defines the name ``label`` (an argument, an assignment or loop target, a def)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.arg) and node.arg == "label":
            found.append(f"{path.name}:{node.lineno} argument")
        elif isinstance(node, ast.Name) and node.id == "label" and isinstance(node.ctx, ast.Store):
            found.append(f"{path.name}:{node.lineno} variable")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "label":
            found.append(f"{path.name}:{node.lineno} def")
    return found


def test_no_bare_label_along_the_retrieval_path():
    assert len(PATH) > 10
    assert [hit for path in PATH for hit in bare_labels(path)] == []


def test_a_late_variant_is_named_by_its_setting():
    late = LateChunking(aggregate="max", chunks=64)
    assert late.setting == f"late-max ({late.chunking})" and late.chunking == "64-token windows"
    assert LateChunking(aggregate="mean", chunks="semantic").setting == "late-mean (semantic chunks)"


def test_scores_are_keyed_by_group_and_bucket():
    per_query = np.array([1.0, 0.0, 0.5, 0.25])
    masks = {"begin": np.array([True, True, False, False]), "end": np.array([False, False, True, True])}
    assert group_scores(per_query, masks) == {"begin": 0.5, "end": 0.375}
    short, _, short_hi = POSIR_BUCKETS[0]
    long_ = POSIR_BUCKETS[-1][0]
    buckets = [posir_length_bucket(short_hi), None, posir_length_bucket(short_hi), long_]
    out = posir_bucket_scores(per_query, buckets=buckets, bins=np.array([0, 0, 1, 2]))
    assert set(out) == {short, long_}
    assert out[short]["n"] == 2 and out[short]["ndcg@10"] == (1.0 + 0.5) / 2
    assert out[short]["bins"] == {0: 1.0, 1: 0.5} and out[long_]["bins"] == {2: 0.25}
