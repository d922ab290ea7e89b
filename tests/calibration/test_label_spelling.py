"""A calibration's label reads back (issue 57 item 4): ``Calibration.parse`` takes what every table and figure prints
(``B128-L0.5-a0.5``, ``B64-Llast1-a1``, ``B16-L0.5-a1-rising``, a figure's ``special=original`` and bare ``prior``)
as the inverse of ``Calibration.label()``; a prior or per-head strengths, which a label names by a digest only,
follow it as in a spec and must have that digest; a misspelt value gets a suggestion."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from posfair import Calibration
from posfair.calibration.positional_prior import PositionalPrior

PRIOR = {"values": [[2.0, 1.0, 0.5]]}
OTHER_PRIOR = {"values": [[1.0, 1.0, 0.5]]}


def label_grid():
    """Settings whose numbers %g writes exactly, over every token a label can hold (no prior, no per-head
    strengths: a label names those by a digest only)."""
    for basket, layers, strength, special, queries, extra in itertools.product(
        (1, 16, 128, 4096),
        (1, 6, 0.5, 0.25, 1.0, 1e-05, (4,), (0, 3, 11)),
        (0.0, 0.5, 0.75, 1.0, 1e-05),
        (
            {},
            dict(isolate_bos=True),
            dict(isolate_bos=False, isolate_eos=True),
            dict(isolate_bos=True, isolate_eos=True, bos_weight=0.1, eos_weight=0.1),
            dict(bos_weight="equal", eos_weight=0.2),
            dict(eos_weight="original"),
        ),
        (None, "pool", "all"),
        (
            {},
            dict(self_share=0.3),
            dict(trailing="merge"),
            dict(trailing="weighted", schedule="rising"),
            dict(schedule="falling", temperature=0.5),
            dict(self_share=0.0, temperature=2e-06),
        ),
    ):
        yield Calibration(basket, layers, strength, queries=queries, **special, **extra)


def test_every_label_reads_back_to_its_setting():
    n = 0
    for cal in label_grid():
        assert Calibration.parse(cal.label()) == cal, cal.label()
        n += 1
    assert n == 4 * 8 * 5 * 6 * 3 * 6


def test_the_labels_a_figure_prints_read_back_too(tmp_path):
    prior_file = tmp_path / "prior.json"
    prior_file.write_text(json.dumps({"prior": PRIOR}))
    for cal in label_grid():
        if cal.special_share is not None:
            assert "special=" in cal.figure_label()
        assert Calibration.parse(cal.figure_label()) == cal, cal.figure_label()
    with_prior = Calibration(16, 0.5, 1.0, prior=PRIOR, schedule="rising")
    assert with_prior.figure_label() == "B16-L0.5-a1-prior-rising"
    assert Calibration.parse(f"{with_prior.figure_label()},prior={prior_file}") == with_prior


@pytest.mark.parametrize(
    ("label", "cal"),
    [
        ("B128-L0.5-a0.5", Calibration()),
        ("B64-Llast1-a1", Calibration(64, 1, 1.0)),
        ("B16-L3+4-a0.75", Calibration(16, (3, 4), 0.75)),
        ("B16-L5+-a1", Calibration(16, (5,), 1.0)),
        ("B16-Lall-a1", Calibration(16, 1.0, 1.0)),
        ("B16-L0.5-a1-rising", Calibration(16, 0.5, 1.0, schedule="rising")),
        ("B16-L0.5-a1-special=original", Calibration(16, 0.5, 1.0).with_special("original")),
        ("B16-L0.5-a1-self0.5", Calibration(16, 0.5, 1.0, self_share=0.5)),
    ],
)
def test_the_labels_tables_print_are_calibrations(label, cal):
    assert Calibration.parse(label) == cal
    assert Calibration.parse(label).spec() == cal.spec()


def test_a_prior_label_takes_the_prior_file_and_checks_its_digest(tmp_path):
    prior_file, other_file = tmp_path / "prior.json", tmp_path / "other.json"
    prior_file.write_text(json.dumps({"prior": PRIOR}))
    other_file.write_text(json.dumps({"prior": OTHER_PRIOR}))
    cal = Calibration(16, 0.5, 1.0, prior=PRIOR)
    label = cal.label()
    assert label == f"B16-L0.5-a1-prior3x1.{PositionalPrior.from_dict(PRIOR).digest()}"
    assert Calibration.parse(f"{label},prior={prior_file}") == cal
    with pytest.raises(ValueError, match=r"names the positional prior by shape and digest only.*prior=FILE"):
        Calibration.parse(label)
    with pytest.raises(ValueError, match=r"names the positional prior by name only.*B16-L0.5-a1-prior,prior=FILE"):
        Calibration.parse("B16-L0.5-a1-prior")
    with pytest.raises(ValueError, match=rf"prior={other_file} is prior3x1\.\w+, not the {label.split('-')[-1]}"):
        Calibration.parse(f"{label},prior={other_file}")
    with pytest.raises(ValueError, match=r"prior= after a label that names no positional prior"):
        Calibration.parse(f"B16-L0.5-a1,prior={prior_file}")


def test_per_head_strengths_follow_their_label_and_match_its_digest():
    cal = Calibration(16, (4, 5), 1.0, head_strengths={4: (0.5, 1.0), 5: (1.0, 0.25)})
    heads = "4:0.5/1+5:1/0.25"
    assert Calibration.parse(f"{cal.label()},heads={heads}") == cal
    with pytest.raises(ValueError, match=r"names the per-head strengths by shape and digest only.*heads="):
        Calibration.parse(cal.label())
    with pytest.raises(ValueError, match=r"not the heads2x2\.\w+ the label names"):
        Calibration.parse(f"{cal.label()},heads=4:0.5/1+5:1/0.5")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("B16-L6-a1", re.escape("L6 is ambiguous: Llast6 is the last 6 layers, L6+ the layer with index 6")),
        ("B16-L0.5", "no a<strength>; a calibration label is B<basket>-L<layers>-a<strength>"),
        ("B16-a1", "no L<layers> where it has 'a1'"),
        ("B16-Lfew-a1", "Lfew: the layers are last<k>, all"),
        ("B16-L0.5-ahalf", "the strength ahalf is not a number"),
        ("B16-L0.5-a1-rising-falling", "'rising' and 'falling' both set schedule"),
        ("B16-L0.5-a1-bos1-special=0.1", "'bos1' and 'special=0.1' both set isolate_bos"),
        ("B16-L0.5-a1-risign", r"unknown setting 'risign' \(known: pool\|all, .*; did you mean 'rising'\?"),
        ("B16-L0.5-a1-trailmerj", "'B16-L0.5-a1-trailmerj': trailmerj must be basket, .*did you mean 'merge'\\?"),
        ("B16-L0.5-a1-special=most", "'B16-L0.5-a1-special=most': special=most must be 'original', 'equal'"),
        (
            "B16-L0.5-a1-rising,schedule=flat",
            "'schedule=flat' after a label: only the values a label names by a digest",
        ),
        ("B16-L0.5-a2", "strength must be a number in \\[0, 1\\]"),
    ],
)
def test_a_malformed_or_ambiguous_label_is_refused_by_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        Calibration.parse(text)


def test_a_misspelt_value_gets_a_suggestion():
    with pytest.raises(ValueError, match=r"got 'defualt'; did you mean 'default'\?$"):
        Calibration.parse("defualt")
    with pytest.raises(ValueError, match=r"unknown variant 'shedule' .*; did you mean 'schedule'\?$"):
        Calibration.parse("16,1,1,shedule=rising")
    with pytest.raises(ValueError, match=r"must be flat, rising or falling; got 'risng'; did you mean 'rising'\?$"):
        Calibration.parse("16,1,1,schedule=risng")
    with pytest.raises(ValueError) as nothing_close:
        Calibration.parse("frobnicate")
    assert "did you mean" not in str(nothing_close.value)


def test_the_command_line_takes_a_label_as_the_spec_it_names(tmp_path, tiny_model_path):
    """``--calibration`` of every command goes through one parser: a label encodes as the spec it names (the
    same vectors), and the serve request's field takes it too (no prior: a request reads no file)."""
    import numpy as np
    from typer.testing import CliRunner

    from posfair.cli import app
    from posfair.cli.parsers import calibration_spec
    from posfair.serve.openai_api import ApiError, request_calibration

    assert calibration_spec("B64-Llast1-a1") == calibration_spec("64,1,1") == Calibration(64, 1, 1.0)
    path, _ = tiny_model_path("bert-mean")
    (tmp_path / "in.txt").write_text("a first text to embed\nand another one, a little longer than the first\n")
    out = {}
    for name, value in (("label", "B4-Llast1-a1-rising"), ("spec", "4,1,1,schedule=rising"), ("stock", None)):
        argv = ["encode", "-m", str(path), "-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / f"{name}.npy")]
        r = CliRunner().invoke(app, argv + (["--calibration", value] if value else []))
        assert r.exit_code == 0, r.output
        out[name] = np.load(tmp_path / f"{name}.npy")
    assert np.array_equal(out["label"], out["spec"]) and not np.allclose(out["label"], out["stock"])
    assert request_calibration("B16-L0.5-a1-rising") == "B16-L0.5-a1-rising"
    for refused, says in (("B16-L0.5-a1-prior", "reads no file"), (f"B{10**7}-L0.5-a1", "basket size must be")):
        with pytest.raises(ApiError, match=says):
            request_calibration(refused)
