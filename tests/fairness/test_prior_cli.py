"""``posfair estimate-prior`` on the bundled model, then the prior used through ``--calibration ...,prior=FILE``."""

import json

import numpy as np
from typer.testing import CliRunner

from posfair import Calibration
from posfair.cli import app


def test_estimate_prior_then_calibrate_with_it(tmp_path, minilm):
    out = tmp_path / "prior.json"
    res = CliRunner().invoke(app, ["estimate-prior", "--out", str(out), "--docs", "6", "--bins", "5"])
    assert res.exit_code == 0, res.output
    body = json.loads(out.read_text())
    assert body["documents"] + body["skipped"] == 6 and body["prior"]["layers"] == list(range(6))
    cal = Calibration.parse(f"16,0.5,1,prior={out}")
    assert cal.prior.bins == 5 and cal.variant == "prior"
    # the bundled model front-loads its attention (its [CLS] key sits in the first bin): the prior falls off after bin 1
    v = np.array(cal.prior.values)
    assert (v[1:, 0] > v[1:, -1]).all()
    text = ["The installer asks for the keyboard layout first. " * 12]
    stock = minilm.encode(text)
    calibrated = minilm.encode(text, calibration=cal)
    assert np.abs(stock - calibrated).max() > 1e-3
    res = CliRunner().invoke(
        app,
        [
            "encode",
            "-i",
            str(_write(tmp_path, text)),
            "-o",
            str(tmp_path / "e.npy"),
            "--calibration",
            f"16,0.5,1,prior={out}",
        ],
    )
    assert res.exit_code == 0, res.output
    np.testing.assert_allclose(np.load(tmp_path / "e.npy"), calibrated, atol=1e-5)


def _write(tmp_path, texts):
    p = tmp_path / "in.txt"
    p.write_text("\n".join(texts) + "\n")
    return p
