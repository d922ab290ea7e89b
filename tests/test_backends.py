"""The table of backends (``posfair.calibration.backends``) is what the dispatch does and what the README says.

- every row's route is the one posfair's dispatch takes for a seeded tiny model of that architecture on
  the installed stack (CI runs this file on transformers 4.x and 5.x), and the dispatch reads the table
  (a row changed in the table changes the route);
- ``import posfair`` hooks exactly the table's modules; on transformers 4.x the table's attention tables
  get posfair's entry;
- rows that say ``flag_free`` save folders that load calibrated with plain ``SentenceTransformer(path)``, the
  others save posfair's previous format;
- the support table of docs/models.md has one row per row label of the table, with the same routes; the README's
  short table names every row.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

import posfair
from posfair import Calibration
from posfair.calibration import STOCK, backends
from posfair.calibration.backends import (
    BACKENDS,
    DEFAULT,
    FALLBACK,
    PROBE,
    REGISTRY,
    TRANSFORMERS4,
    backend_for,
    import_hooks,
)
from posfair.model.compat import TRANSFORMERS_5
from remote_code_models import build_remote_model
from tiny_models import ALL_ARCHS, ARCHS, expected_mechanism, model_type

README = Path(__file__).resolve().parents[1] / "README.md"
#: the full support table: the documentation site's "Models and stacks" page
MODELS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "models.md"
TEXTS = ["Calibration gives later baskets as much attention as early ones. " * 8, "A short text about search."]
CAL = Calibration(basket_size=16, layers=0.5, strength=1.0)
#: the remote-code rows and the default, each with the tiny remote model of its shape
#: (tests/remote_code_models.py): (declared model_type, attention kind)
REMOTE = {
    "gte": ("new", "sdpa"),
    "jina": ("xlm-roberta", "packed"),
    "other": ("posfair_tiny_remote", "functional"),
}


def _remote_row(name: str) -> backends.Backend:
    return backend_for(REMOTE[name][0], remote_code=True)


def _probed_mechanism(monkeypatch, path, **load) -> str:
    """The route posfair's probe finds for the model at ``path`` with no row for it (the table's default)."""
    with monkeypatch.context() as patched:
        patched.setattr(backends, "BACKENDS", ())
        module = posfair.load_model(path, **load).transformer_module
        assert module.backend_row is DEFAULT
        return module.mechanism


# the engine's architectures (tiny_models.ARCHS) are checked the same way by tests/calibration/test_engine.py
# (test_fast_path_matches_independent_reference: ``model.mechanism == expected_mechanism(arch)``)
@pytest.mark.parametrize("arch", [a for a in ALL_ARCHS if a not in ARCHS])
def test_each_architecture_takes_its_rows_route(arch, tiny_model_path, monkeypatch):
    """The row's route is the one the dispatch takes, and the one the probe alone finds (a row saying
    "fallback" is not a registry route left unused)."""
    row = backend_for(model_type(arch))
    assert row is not DEFAULT, f"{arch} ({model_type(arch)}) has no row in the table of backends"
    path, pooling = tiny_model_path(arch)
    module = posfair.load_model(path, pooling=pooling).transformer_module
    assert module.backend_row is row
    assert module.mechanism == row.route(TRANSFORMERS_5) == expected_mechanism(arch)
    probed = _probed_mechanism(monkeypatch, path, pooling=pooling)
    if probed != row.route(TRANSFORMERS_5):  # only where the registry, reached, refuses to calibrate
        assert (row.route(TRANSFORMERS_5), probed) == (FALLBACK, REGISTRY)
        with monkeypatch.context() as patched:
            patched.setattr(backends, "BACKENDS", ())
            with pytest.raises(ValueError, match="does not support"):
                posfair.load_model(path, pooling=pooling).encode(TEXTS, calibration=CAL)


@pytest.mark.parametrize("name", sorted(REMOTE))
def test_remote_code_takes_its_rows_route(name, tmp_path, monkeypatch):
    declared, kind = REMOTE[name]
    row = _remote_row(name)
    assert (row is DEFAULT) == (name == "other")
    build_remote_model(tmp_path / "m", kind, model_type=declared)
    load = dict(trust_remote_code=True, pooling="cls")
    module = posfair.load_model(tmp_path / "m", **load).transformer_module
    assert module.backend_row is row
    # the default probes; this model's own softmax / SDPA is never reached through the registry
    want = row.route(TRANSFORMERS_5)
    assert module.mechanism == (FALLBACK if want == PROBE else want)
    assert _probed_mechanism(monkeypatch, tmp_path / "m", **load) == FALLBACK


def test_every_row_is_exercised():
    """Each row of the table has a tiny model above (a row without one is a claim no test checks)."""
    covered = {backend_for(model_type(a)) for a in ALL_ARCHS} | {_remote_row(n) for n in REMOTE}
    assert [row.readme for row in (*BACKENDS, DEFAULT) if row not in covered] == []


def test_the_dispatch_reads_the_table(monkeypatch, tiny_model_path):
    """Qwen3 reaches the registry on both stacks; with its row saying "fallback" the dispatch intercepts instead,
    and calibrates the same numbers."""
    path, pooling = tiny_model_path("qwen3")
    want = posfair.load_model(path, pooling=pooling)
    assert want.transformer_module.mechanism == REGISTRY
    row = backend_for("qwen3")
    changed = tuple(dataclasses.replace(r, on_4=FALLBACK, on_5=FALLBACK) if r is row else r for r in BACKENDS)
    monkeypatch.setattr(backends, "BACKENDS", changed)
    other = posfair.load_model(path, pooling=pooling)
    assert other.transformer_module.mechanism == FALLBACK
    np.testing.assert_allclose(other.encode(TEXTS, calibration=CAL), want.encode(TEXTS, calibration=CAL), atol=1e-5)


def test_import_posfair_hooks_the_tables_modules():
    """Before transformers is imported, ``import posfair`` waits for exactly the table's modules, and each
    hook's route module has the ``on_import`` it calls."""
    code = "import json, posfair, posfair.runtime.post_import as p; print(json.dumps(sorted(p._CALLBACKS)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == sorted(import_hooks())
    assert import_hooks()["transformers.modeling_utils"] == REGISTRY
    for module, route in import_hooks().items():
        assert importlib.util.find_spec(module) is not None, module
        assert callable(importlib.import_module(backends.ROUTE_MODULES[route]).on_import)


@pytest.mark.parametrize("row", [r for r in BACKENDS if r.table_4 is not None], ids=lambda r: r.model_types[0])
def test_the_attention_tables_are_extended_on_4x(row):
    """On transformers 4.x each table the rows name exists and has posfair's entry once its module is imported
    (after ``import posfair``); on 5.x those tables are gone (a calibrated folder goes through the registry)."""
    module = importlib.import_module(row.module)
    name, kind = row.table_4
    table = getattr(module, name, None)
    if TRANSFORMERS_5:
        assert table is None and row.plain_route(True) == REGISTRY
        return
    assert row.plain_route(False) == TRANSFORMERS4
    assert isinstance(table, dict) and "sdpa" in table and backends.ATTN_SDPA in table
    entry = table[backends.ATTN_SDPA]
    assert isinstance(entry, type) if kind == "class" else not isinstance(entry, type)


# the rows whose saving tests/calibration/test_flag_free.py does not cover (it covers tiny_models.ARCHS; the
# other decoders take Qwen3's route, the registry, on both stacks: checked above)
@pytest.mark.parametrize("arch", ["roberta", "gemma2"])
def test_a_rows_saved_folder_loads_as_the_row_says(arch, tiny_model_path, tmp_path):
    """flag_free: plain ``SentenceTransformer(path)`` loads the calibrated folder calibrated; else the folder
    names posfair's module class and ``posfair.load_model`` loads it calibrated."""
    row = backend_for(model_type(arch))
    path, pooling = tiny_model_path(arch)
    model = posfair.load_model(path, pooling=pooling)
    want = model.encode(TEXTS, calibration=CAL)
    assert np.abs(want - model.encode(TEXTS, calibration=STOCK)).max() > 1e-3  # CAL changes these texts
    model.set_calibration(CAL).save(str(tmp_path / "m"))
    types = [e["type"] for e in json.loads((tmp_path / "m" / "modules.json").read_text())]
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    if row.flag_free:
        assert config["attn_implementation"] == backends.ATTN_SDPA
        assert all(t.startswith("sentence_transformers.") for t in types), types
        np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "m")).encode(TEXTS), want, atol=1e-5)
    else:
        assert "posfair" not in json.dumps(config) and "posfair.model.CalibratedTransformer" in types
    np.testing.assert_allclose(posfair.load_model(tmp_path / "m").encode(TEXTS), want, atol=1e-5)


# -- the README's support table ---------------------------------------------------------------------------------


def readme_support_table() -> dict[str, dict[str, str]]:
    """The rows of the table in "Supported stacks and models" (docs/models.md): first cell -> cells by header."""
    text = MODELS_PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Supported stacks and models") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split(" | ")]
    rows = {}
    for line in lines[2:]:  # after the header and its --- line
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == len(header), line
        assert cells[0] not in rows, f"two README rows {cells[0]!r}"
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _route_word(cell: str) -> str:
    return re.match(r"[a-z]+", cell).group(0)


def test_the_readme_support_table_is_the_table_of_backends():
    readme = readme_support_table()
    assert set(readme) == {row.readme for row in (*BACKENDS, DEFAULT)}
    for row in (*BACKENDS, DEFAULT):
        cells = readme[row.readme]
        assert _route_word(cells["transformers 5.x"]) == row.on_5, row.readme
        assert _route_word(cells["transformers 4.x"]) == row.on_4, row.readme
        # a calibrated folder's own route on 4.x (the architecture's attention table) is said where it applies
        assert ("attention table" in cells["transformers 4.x"]) == (row.plain_route(False) == TRANSFORMERS4), row.readme


def test_one_row_per_architecture_and_per_readme_line():
    labels = [row.readme for row in BACKENDS]
    assert len(labels) == len(set(labels))  # one README line per row
    types = [(t, row.remote_code) for row in BACKENDS for t in row.model_types]
    assert len(types) == len(set(types))  # one row per architecture


def test_the_readme_short_table_names_every_row_of_the_models_page():
    """The README's short "Supported models" table names every architecture of the full table (docs/models.md),
    so a row added to the table of backends is missing from the README's first screen only if this fails."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Supported models") :]
    section = section[: section.index("\n## ", 1)]
    first_cells = " ; ".join(line.split(" | ")[0] for line in section.splitlines() if line.startswith("| "))
    missing = [label for label in readme_support_table() if label.split(" (")[0] not in first_cells]
    assert not missing, f"the README's short table does not name: {missing}"
