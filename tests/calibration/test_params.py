from __future__ import annotations

import pytest

from posfair import Calibration


def test_defaults_are_the_robust_default():
    c = Calibration()
    assert (c.basket_size, c.layers, c.strength) == (128, 0.5, 0.5)
    assert (c.bos_weight, c.eos_weight) == ("original", "equal")


@pytest.mark.parametrize(
    "layers,n,expected",
    [
        (0.5, 12, tuple(range(6, 12))),
        (0.5, 6, (3, 4, 5)),
        (0.5, 1, (0,)),  # max(1, floor(0.5 * 1))
        (0.3, 4, (3,)),  # floor(1.2) = 1
        (1.0, 4, (0, 1, 2, 3)),
        (1, 12, (11,)),
        (6, 12, tuple(range(6, 12))),
        ((0, 2), 4, (0, 2)),
        ([3, 1], 4, (1, 3)),
    ],
)
def test_layer_resolution(layers, n, expected):
    assert Calibration(layers=layers).layer_indices(n) == expected


@pytest.mark.parametrize(
    "pooling,bos,eos,queries",
    [("cls", True, False, "pool"), ("lasttoken", True, True, "pool"), ("mean", False, False, "all")],
)
def test_resolution_defaults_follow_pooling(pooling, bos, eos, queries):
    r = Calibration().resolve(pooling, 12)
    assert (r.isolate_bos, r.isolate_eos, r.queries) == (bos, eos, queries)
    r = Calibration(isolate_bos=False, queries="all").resolve(pooling, 12)
    assert (r.isolate_bos, r.queries) == (False, "all")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(basket_size=0), "basket_size"),
        (dict(basket_size=2.5), "basket_size"),
        (dict(strength=-0.1), r"strength .*\[0, 1\]"),
        (dict(strength=1.01), "strength"),
        (dict(layers=0), "layers"),
        (dict(layers=1.5), r"\(0, 1\]"),
        (dict(layers=()), "empty"),
        (dict(layers=(1, 1)), "duplicate"),
        (dict(layers=(-1,)), "layer indices"),
        (dict(bos_weight="half"), "bos_weight"),
        (dict(eos_weight=1.0), r"eos_weight.*\[0, 1\)"),
        (dict(bos_weight=0.6, eos_weight=0.5), "no attention mass"),
        (dict(queries="some"), "queries"),
        (dict(isolate_bos="yes"), "isolate_bos"),
    ],
)
def test_invalid_values_name_the_parameter(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Calibration(**kwargs)


def test_layer_out_of_range_is_named():
    with pytest.raises(ValueError, match=r"out of range.*6 layers"):
        Calibration(layers=(2, 7)).layer_indices(6)
    with pytest.raises(ValueError, match="only 6"):
        Calibration(layers=8).layer_indices(6)


def test_immutable_hashable_and_roundtrip():
    c = Calibration(basket_size=64, layers=(1, 3), strength=0.25, bos_weight=0.1)
    with pytest.raises(AttributeError):
        c.strength = 1.0  # type: ignore[misc]
    assert Calibration.from_dict(c.to_dict()) == c
    assert hash(c) == hash(Calibration.from_dict(c.to_dict()))
    assert c.key() == Calibration.from_dict(c.to_dict()).key() != Calibration().key()


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("128,0.5,0.5", Calibration(128, 0.5, 0.5)),
        ("512,1,1.0", Calibration(512, 1, 1.0)),
        ("64,3+4+5,1", Calibration(64, (3, 4, 5), 1.0)),
    ],
)
def test_parse(spec, expected):
    assert Calibration.parse(spec) == expected


def test_parse_errors():
    with pytest.raises(ValueError, match="BASKET,LAYERS,STRENGTH"):
        Calibration.parse("128,0.5")
    with pytest.raises(ValueError, match="basket size"):
        Calibration.parse("x,0.5,0.5")


def test_parse_default_is_the_robust_default_everywhere():
    from posfair.cli.checks import calibration
    from posfair.cli.parsers import calibration_spec

    assert (
        Calibration.parse("default")
        == Calibration.parse(" Default ")
        == Calibration()
        == Calibration.parse("128,0.5,0.5")
    )
    assert calibration(calibration_spec("default")) == Calibration()
    assert calibration(calibration_spec("default"), strength=1.0) == Calibration(strength=1.0)
    assert [calibration_spec(s) for s in ("default", "64,1,1")] == [
        Calibration(),
        Calibration(basket_size=64, layers=1, strength=1.0),
    ]
    with pytest.raises(ValueError, match="or 'default'; got 'defaults'"):
        Calibration.parse("defaults")


def test_a_calibration_in_words():
    from posfair.calibration import Calibration

    assert Calibration().describe() == "baskets of 128 tokens, the last 50% of layers, strength 0.5"
    assert (
        Calibration(basket_size=64, layers=1, strength=1.0).describe()
        == "baskets of 64 tokens, the last layer, strength 1"
    )
    assert Calibration(layers=3).describe() == "baskets of 128 tokens, the last 3 layers, strength 0.5"
    assert Calibration(layers=1.0).describe().startswith("baskets of 128 tokens, every layer")
    assert "layers 3, 4, 5 (0-based)" in Calibration(layers=(3, 4, 5)).describe()
    assert Calibration(self_share=0.25).describe().endswith("keeping 0.25 of each row's self-attention")


def test_every_special_share_is_said_in_words():
    """with_special("original") sets the EOS share to "original", which is not EOS's default: said, not
    formatted as a number (it raised); numbers and "equal" likewise."""
    from posfair.calibration import Calibration

    base = Calibration(basket_size=16, layers=0.5, strength=1.0)
    assert (
        base.with_special("original")
        .describe()
        .endswith("BOS in its own basket, EOS in its own basket, EOS keeps its original mass")
    )
    assert base.with_special("equal").describe().endswith("BOS gets a basket's equal share")
    assert base.with_special(0.1).describe().endswith("BOS gets 0.1 of the row, EOS gets 0.1 of the row")
