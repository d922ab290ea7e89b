"""A setting's label spells its layers so that no two kinds read alike (issue 49 item 3): on the command line ``1`` is
the last layer and ``1.0`` every layer; their labels were ``L1`` and ``L1.0``, one character apart."""

from __future__ import annotations

import itertools

from posfair import Calibration


def test_the_last_layer_every_layer_a_share_and_explicit_indices_have_labels_apart():
    labels = {spec: Calibration.parse(spec).label() for spec in
              ("128,1,0.5", "128,1.0,0.5", "128,0.5,0.5", "128,4,0.5", "128,4+,0.5", "128,3+4,0.5")}  # fmt: skip
    assert labels == {"128,1,0.5": "B128-Llast1-a0.5", "128,1.0,0.5": "B128-Lall-a0.5",
                      "128,0.5,0.5": "B128-L0.5-a0.5", "128,4,0.5": "B128-Llast4-a0.5",
                      "128,4+,0.5": "B128-L4+-a0.5", "128,3+4,0.5": "B128-L3+4-a0.5"}  # fmt: skip
    assert Calibration().label() == "B128-L0.5-a0.5"  # the default keeps its name


def test_two_settings_share_a_label_only_when_they_calibrate_the_same_layers_the_same_way():
    layer_sets = [1, 2, 6, 0.25, 0.5, 1.0, (0,), (1,), (5,), (0, 1), (4, 5)]
    cals = [Calibration(basket_size=64, layers=x, strength=1.0) for x in layer_sets]
    for a, b in itertools.combinations(cals, 2):
        assert a.label() != b.label(), (a.layers, b.layers)
        assert a.figure_label() != b.figure_label()
    for c in cals:  # never a bare whole number after the L
        layers = c.label().split("-")[1][1:]
        assert not layers.isdigit(), c.label()
