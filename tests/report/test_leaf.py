"""report/ is a leaf: generic renderers only, no posfair area, no pyplot."""

import ast
import subprocess
import sys
from pathlib import Path

import posfair.report

REPORT = Path(posfair.report.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_report_imports_no_posfair_area():
    for path in REPORT.glob("*.py"):
        own = {m for m in _imports(path) if m == "posfair" or m.startswith("posfair.")}
        assert all(m.startswith(("posfair.report", "posfair.files.atomic")) for m in own), (path.name, own)


def test_no_pyplot_and_no_backend_switch():
    fairness = REPORT.parent / "fairness"
    for path in [*REPORT.glob("*.py"), *fairness.glob("*.py")]:
        if path.name in ("cli.py", "attention_cli.py"):
            continue
        text = path.read_text()
        assert "matplotlib.use(" not in text, path.name
        assert not any(m.endswith("pyplot") for m in _imports(path)), path.name


def test_figures_leave_pyplot_alone(tmp_path):
    """Drawing and saving a figure neither imports pyplot nor touches the backend (a notebook user's stays)."""
    code = f"""
import sys
import numpy as np, pandas as pd
import matplotlib
backend = dict.__getitem__(matplotlib.rcParams, "backend")  # get_backend() would import pyplot itself
from posfair.report.plots import ProfileSeries, profile_grid, save_figure, tradeoff_scatter
data = pd.DataFrame({{"row": 2, "col": "en", "x": np.tile([1, 2], 6), "value": np.arange(12.0), "cluster": np.repeat(np.arange(6), 2)}})
fig = profile_grid([ProfileSeries("s", data)], rows=[2], cols=["en"])
save_figure(fig, {str(tmp_path / "f")!r})
pts = pd.DataFrame({{"panel": ["a", "a"], "label": ["x", "y"], "x": [0.1, 0.2], "y": [0.5, 0.6], "reference": [True, False]}})
save_figure(tradeoff_scatter(pts, xlabel="x", ylabel="y"), {str(tmp_path / "g")!r})
assert "matplotlib.pyplot" not in sys.modules
assert dict.__getitem__(matplotlib.rcParams, "backend") == backend
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "g.pdf").is_file()
