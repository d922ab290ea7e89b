"""benchmarks/gpu_check.py runs on CPU at small sizes (so it cannot rot between lent GPUs): it writes its JSON
and prints its table, its correctness part compares against tests/reference.py's float64 forward (a broken
every-row path is reported as FAILED, not passed), and it leaves posfair's dispatch as it found it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import posfair.calibration.baskets as baskets
import posfair.calibration.cuda_rows as cuda_rows
import posfair.calibration.fused as fused

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
ARGS = [
    "--device",
    "cpu",
    "--small",
    "--archs",
    "bert-mean",
    "--lengths",
    "48",
    "--batch-tokens",
    "96",
    "--rounds",
    "1",
]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_runs_on_cpu_and_checks_the_cuda_path_against_the_reference(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert _script().main([*ARGS, "--skip", "throughput", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {(r["pooling"], r["dtype"]): r for r in result["correctness"]}
    assert set(rows) == {("mean", "float32"), ("mean", "bfloat16")}
    for (_, dtype), r in rows.items():
        assert r["ok"] and r["rel_error"] <= result["tolerance"][dtype] and r["rel_error"] < r["calibration_moved"]
        assert r["cuda_path_calls"] == 2  # the CUDA path's code ran in both calibrated layers (switch on for CPU)
    timed = result["timing"][0]
    assert timed["length"] == 48 and timed["every-row"]["time_s"] > 0 and timed["every-row_time_ratio"] > 0
    printed = capsys.readouterr().out
    assert "(a) correctness" in printed and "bert-mean   mean       float32" in printed and f"wrote {out}" in printed
    assert cuda_rows.cuda_every_row_available.__name__ == "cuda_every_row_available" and fused.ENABLED  # restored


def test_a_wrong_every_row_path_fails_the_check(tmp_path, monkeypatch):
    """The comparison is real: basket weights off by a little fail the float32 tolerance."""
    real = baskets.basket_weights

    def skewed(mass, *a, **kw):
        w, bos, eos = real(mass, *a, **kw)
        return w * 1.01, bos, eos

    monkeypatch.setattr(fused, "basket_weights", skewed)
    out = tmp_path / "gpu.json"
    assert _script().main([*ARGS, "--skip", "timing", "throughput", "--out", str(out)]) == 1
    rows = json.loads(out.read_text())["correctness"]
    assert not next(r for r in rows if r["dtype"] == "float32")["ok"]
