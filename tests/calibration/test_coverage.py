"""Which texts a calibration changes: the rule, its agreement with the engine, and encode's one warning per call."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from posfair import Calibration
from posfair.calibration import STOCK
from posfair.calibration.baskets import calibrate_rows, calibrate_span_
from posfair.calibration.coverage import (
    CALIBRATED,
    ONE_BASKET,
    SHORTER,
    STRENGTH_ZERO,
    CalibrationFallbackWarning,
    calibrated_mask,
    calibration_coverage,
    fallback_reasons,
    format_share,
    quiet_fallback,
)
from posfair.calibration.params import BasketSettings


def resolved(pooling: str, **kw):
    return Calibration(layers=1, **kw).resolve(pooling, 4)


# -- the rule, by hand --------------------------------------------------------------------------


def test_share_of_50_130_300_content_tokens_with_b128_is_two_thirds():
    # mean pooling isolates nothing: content = every valid token
    mean = resolved("mean", basket_size=128)
    assert fallback_reasons(mean, [50, 130, 300]).tolist() == [SHORTER, CALIBRATED, CALIBRATED]
    cov = calibration_coverage(mean, [50, 130, 300])
    assert (cov.total, cov.calibrated, cov.shorter, cov.one_basket) == (3, 2, 1, 0)
    assert cov.share == pytest.approx(2 / 3)
    # CLS pooling isolates the BOS key: 50 / 130 / 300 content tokens are 51 / 131 / 301 valid tokens
    cls = resolved("cls", basket_size=128)
    assert calibrated_mask(cls, [51, 131, 301]).tolist() == [False, True, True]
    # last-token pooling isolates BOS and EOS: 2 more
    last = resolved("lasttoken", basket_size=128)
    assert calibrated_mask(last, [52, 132, 302]).tolist() == [False, True, True]
    # an unresolved Calibration needs the pooling, and gives the same answer
    assert calibrated_mask(Calibration(basket_size=128), [51, 131, 301], pooling="cls").tolist() == [False, True, True]
    with pytest.raises(ValueError, match="pooling"):
        calibrated_mask(Calibration(basket_size=128), [51])


def test_exactly_one_basket_is_the_identity_unless_an_isolated_key_is_reweighted():
    B = 128
    # mean pooling: C = n; C == B is one basket holding all the mass
    assert fallback_reasons(resolved("mean", basket_size=B), [127, 128, 129]).tolist() == [
        SHORTER,
        ONE_BASKET,
        CALIBRATED,
    ]
    # CLS, BOS kept at its original mass: C = n - 1
    assert fallback_reasons(resolved("cls", basket_size=B), [128, 129, 130]).tolist() == [
        SHORTER,
        ONE_BASKET,
        CALIBRATED,
    ]
    # CLS, BOS given 1 / n_total = 1/2: one basket is changed too
    assert fallback_reasons(resolved("cls", basket_size=B, bos_weight="equal"), [128, 129]).tolist() == [
        SHORTER,
        CALIBRATED,
    ]
    # last token: EOS gets "equal" by default, so C == B is calibrated; with EOS "original" it is not
    assert fallback_reasons(resolved("lasttoken", basket_size=B), [130]).tolist() == [CALIBRATED]
    assert fallback_reasons(resolved("lasttoken", basket_size=B, eos_weight="original"), [130]).tolist() == [ONE_BASKET]
    # strength 0 changes nothing whatever the length
    assert fallback_reasons(resolved("mean", basket_size=4, strength=0.0), [3, 400]).tolist() == [
        STRENGTH_ZERO,
        STRENGTH_ZERO,
    ]


def test_messages_carry_the_counts():
    mean = resolved("mean", basket_size=128)
    assert calibration_coverage(mean, [50, 130, 300]).message() == (
        "1 of 3 texts are shorter than one basket (B=128 content tokens) and were encoded stock (calibrated share 0.667)"
    )
    assert calibration_coverage(mean, [50, 128, 60, 300]).message() == (
        "3 of 4 texts were encoded stock (B=128 content tokens): 2 are shorter than one basket and 1 fills exactly one "
        "basket, which calibration leaves unchanged (calibrated share 0.250)"
    )
    assert calibration_coverage(mean, [130, 300]).message() is None
    assert (
        calibration_coverage(resolved("mean", basket_size=4, strength=0.0), [9, 9]).message()
        == "calibration strength is 0: all 2 texts were encoded stock"
    )
    cov = calibration_coverage(mean, [5, 6])
    assert cov.noop and cov.share == 0.0
    assert format_share(cov.share) == "0.000" and format_share(float("nan")) == "—" and format_share(None) == "—"


# -- the rule agrees with the engine ----------------------------------------------------------------


CASES = [
    dict(pooling="mean"),
    dict(pooling="cls"),
    dict(pooling="cls", bos_weight="equal"),
    dict(pooling="lasttoken"),
    dict(pooling="lasttoken", eos_weight="original"),
    dict(pooling="cls", isolate_eos=True, eos_weight=0.2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_rule_says_exactly_which_rows_the_engine_changes(case):
    case = dict(case)
    pooling = case.pop("pooling")
    B, K = 5, 16
    rng = np.random.default_rng(0)
    for strength in (0.0, 0.5, 1.0):
        cal = resolved(pooling, basket_size=B, strength=strength, **case)
        settings = BasketSettings(basket_size=B, strength=strength, isolate_bos=cal.isolate_bos,
                                  isolate_eos=cal.isolate_eos, bos_weight=cal.bos_weight,
                                  eos_weight=cal.eos_weight)  # fmt: skip
        for n in range(1, K + 1):
            for start in (0, K - n):  # right and left padding
                row = np.zeros(K)
                row[start : start + n] = rng.dirichlet(np.ones(n))
                a = torch.tensor(row, dtype=torch.float64)
                out = calibrate_rows(a[None], start, start + n - 1, settings)[0]
                changed = not torch.allclose(out, a, atol=1e-12, rtol=0)
                assert changed == bool(calibrated_mask(cal, [n])[0]), (strength, n, start)
                span = calibrate_span_(a[None].clone(), start, start + n - 1, settings)[0]
                assert (not torch.allclose(span, a, atol=1e-12, rtol=0)) == changed


# -- FairModel: counts per encode call ------------------------------------------------------------


def words(k: int) -> str:
    return " ".join(["word"] * k)  # one WordPiece token per "word"


@pytest.fixture(scope="module")
def mean_model(tiny_model):
    return tiny_model("bert-mean")


def fallback_warnings(caught):
    return [w for w in caught if issubclass(w.category, CalibrationFallbackWarning)]


def test_encode_warns_once_with_the_counts_and_the_count_is_what_the_engine_did(mean_model):
    texts = [words(48), words(128), words(298)]  # + [CLS] + [SEP]: 50 / 130 / 300 valid tokens = content (mean pooling)
    cal = Calibration(basket_size=128, layers=0.5, strength=1.0)
    assert mean_model.encoded_lengths(texts).tolist() == [50, 130, 300]
    assert mean_model.calibrated_share(texts, cal) == pytest.approx(2 / 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = mean_model.encode(texts, calibration=cal, batch_size=1)  # three batches, one warning
    msgs = fallback_warnings(caught)
    assert len(msgs) == 1
    assert str(msgs[0].message) == (
        "1 of 3 texts are shorter than one basket (B=128 content tokens) and were encoded stock (calibrated share 0.667)"
    )
    stock = mean_model.encode(texts, calibration=STOCK)
    assert np.allclose(got[0], stock[0], atol=1e-6)  # the fallen-back text is the stock embedding
    assert not np.allclose(got[1], stock[1], atol=1e-4) and not np.allclose(got[2], stock[2], atol=1e-4)


def test_exactly_one_basket_encodes_stock(mean_model):
    texts = [words(126), words(127)]  # 128 and 129 valid tokens
    cal = Calibration(basket_size=128, layers=0.5, strength=1.0)
    cov = mean_model.calibration_coverage(texts, cal)
    assert (cov.calibrated, cov.one_basket, cov.shorter) == (1, 1, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = mean_model.encode(texts, calibration=cal)
    assert "1 fills exactly one basket" in str(fallback_warnings(caught)[0].message)
    stock = mean_model.encode(texts, calibration=STOCK)
    assert np.allclose(got[0], stock[0], atol=1e-6) and not np.allclose(got[1], stock[1], atol=1e-4)


def test_counts_follow_truncation_prompt_and_default_calibration(mean_model):
    cal = Calibration(basket_size=128, layers=0.5, strength=1.0)
    old = mean_model.max_seq_length
    try:
        mean_model.max_seq_length = 100  # 300 tokens truncated to 100: shorter than one basket
        assert mean_model.encoded_lengths([words(298)]).tolist() == [100]
        assert mean_model.calibrated_share([words(298)], cal) == 0.0
    finally:
        mean_model.max_seq_length = old
    # "query: " adds 2 tokens: 125 + 2 specials + 2 = 129 > 128
    assert mean_model.encoded_lengths([words(125)], prompt="query: ").tolist() == [129]
    assert mean_model.calibrated_share([words(125)], cal) == 0.0
    assert mean_model.calibrated_share([words(125)], cal, prompt="query: ") == 1.0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mean_model.encode([words(125)], calibration=cal, prompt="query: ")
        mean_model.encode([words(10)], calibration=STOCK)  # stock: nothing to report
        with quiet_fallback():
            mean_model.encode([words(10)], calibration=cal)
        with mean_model.using(cal):  # MODEL_DEFAULT inside using(): the override is what runs
            mean_model.encode([words(10)])
    msgs = fallback_warnings(caught)
    assert [str(m.message)[:9] for m in msgs] == ["1 of 1 te"]
    try:
        mean_model.set_calibration(cal)
        with pytest.warns(CalibrationFallbackWarning, match="1 of 2 texts"):
            mean_model.encode([words(10), words(200)])  # the model's default calibration
        assert mean_model.calibrated_share([words(10), words(200)]) == 0.5
    finally:
        mean_model.set_calibration(STOCK)
    with pytest.raises(ValueError, match="no default calibration"):
        mean_model.calibrated_share([words(10)])
