"""FairModel as a drop-in SentenceTransformer: encode arguments, persistence, bad input."""

from __future__ import annotations

import pickle  # only to mimic how multi-process workers receive the model; posfair stores nothing with it
import warnings

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

import posfair
from posfair import Calibration
from posfair.calibration import MODEL_DEFAULT, STOCK
from posfair.encoding import encode_cached, encoder, resolved_calibration
from tiny_models import build_tiny_model

LONG = "Calibration gives later baskets as much attention as early ones. " * 8
TEXTS = [LONG, "A much shorter text about search engines and their indexes.", LONG[:200]]
CAL = Calibration(basket_size=16, layers=0.5, strength=1.0)


def test_is_a_sentence_transformer(minilm):
    assert isinstance(minilm, SentenceTransformer)
    assert minilm.get_embedding_dimension() == 384


def test_encode_with_calibration_honours_st_arguments(minilm):
    base = minilm.encode(TEXTS, calibration=CAL, batch_size=2)
    assert isinstance(base, np.ndarray) and base.shape == (3, 384)
    as_tensor = minilm.encode(TEXTS, calibration=CAL, convert_to_tensor=True)
    assert isinstance(as_tensor, torch.Tensor)
    np.testing.assert_allclose(as_tensor.numpy(), base, atol=1e-6)
    normed = minilm.encode(TEXTS, calibration=CAL, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(normed, axis=1), 1.0, atol=1e-5)
    one = minilm.encode(TEXTS[0], calibration=CAL)
    assert one.shape == (384,)
    np.testing.assert_allclose(one, base[0], atol=1e-5)
    # a prompt changes the input text exactly like ST does
    prompted = minilm.encode(TEXTS[:1], calibration=CAL, prompt="query: ")
    direct = minilm.encode(["query: " + TEXTS[0]], calibration=CAL)
    np.testing.assert_allclose(prompted, direct, atol=1e-6)


def test_token_embeddings_are_calibrated_too(minilm):
    stock = minilm.encode(TEXTS[:1], output_value="token_embeddings")
    cal = minilm.encode(TEXTS[:1], output_value="token_embeddings", calibration=CAL)
    assert stock[0].shape == cal[0].shape
    assert (stock[0] - cal[0]).abs().max() > 1e-3


def test_model_default_uses_the_models_calibration_stock_forces_stock(minilm, tmp_path):
    stock = minilm.encode(TEXTS)
    try:
        minilm.set_calibration(CAL)
        assert minilm.calibration == CAL
        calibrated = minilm.encode(TEXTS, calibration=CAL)
        np.testing.assert_allclose(minilm.encode(TEXTS), calibrated, atol=1e-6)
        np.testing.assert_allclose(minilm.encode(TEXTS, calibration=MODEL_DEFAULT), calibrated, atol=1e-6)
        np.testing.assert_allclose(minilm.encode(TEXTS, calibration=STOCK), stock, atol=1e-6)
        with minilm.using(
            STOCK
        ):  # a using() block changes what MODEL_DEFAULT runs with, and what the encoding layer resolves
            np.testing.assert_allclose(minilm.encode(TEXTS), stock, atol=1e-6)
            assert resolved_calibration(minilm, MODEL_DEFAULT) is STOCK
        assert resolved_calibration(minilm, MODEL_DEFAULT) == CAL
    finally:
        minilm.set_calibration(STOCK)
    assert minilm.calibration is STOCK
    np.testing.assert_allclose(minilm.encode(TEXTS), stock, atol=1e-6)


@pytest.mark.parametrize("value", [None, False, "stock", 0])
def test_none_false_and_other_values_are_refused_in_every_layer(minilm, value):
    """ "No calibration given" has one spelling per meaning: None / False / a string are TypeErrors naming STOCK."""
    calls = [
        lambda: minilm.encode(TEXTS, calibration=value),
        lambda: minilm.set_calibration(value),
        lambda: minilm.calibrated_share(TEXTS, value),
        lambda: encode_cached(minilm, TEXTS, calibration=value),
        lambda: encoder(minilm, value),
        lambda: resolved_calibration(minilm, value),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="posfair.STOCK"):
            call()
    with pytest.raises(TypeError, match="posfair.STOCK"), minilm.using(value):
        pass
    with pytest.raises(TypeError, match="MODEL_DEFAULT has no meaning"):
        minilm.set_calibration(MODEL_DEFAULT)


def test_stock_and_model_default_are_singletons_without_a_truth_value():
    import copy

    assert copy.deepcopy(STOCK) is STOCK and copy.copy(MODEL_DEFAULT) is MODEL_DEFAULT
    assert type(STOCK)() is STOCK and repr(STOCK) == "posfair.STOCK"
    assert STOCK.key() == STOCK.label() == "stock"
    with pytest.raises(TypeError, match="truth value"):
        bool(STOCK)
    with pytest.raises(TypeError, match="truth value"):
        bool(MODEL_DEFAULT)


def test_a_plain_sentence_transformer_resolves_to_stock_and_refuses_a_calibration(minilm):
    plain = SentenceTransformer(str(posfair.model.bundled_model_path()))
    assert resolved_calibration(plain, MODEL_DEFAULT) is STOCK and resolved_calibration(plain, STOCK) is STOCK
    with pytest.raises(TypeError, match="takes no calibration"):
        resolved_calibration(plain, CAL)


def test_saved_calibration_is_used_by_plain_sentence_transformers(tmp_path):
    model = posfair.load_model()
    want = model.encode(TEXTS, calibration=CAL)
    stock = model.encode(TEXTS)
    model.set_calibration(CAL).save(str(tmp_path / "m"))
    # no trust_remote_code: the folder holds stock modules (tests/calibration/test_flag_free.py)
    plain = SentenceTransformer(str(tmp_path / "m"))
    np.testing.assert_allclose(plain.encode(TEXTS), want, atol=1e-6)
    again = posfair.load_model(tmp_path / "m")
    assert again.calibration == CAL
    np.testing.assert_allclose(again.encode(TEXTS), want, atol=1e-6)
    np.testing.assert_allclose(again.encode(TEXTS, calibration=STOCK), stock, atol=1e-6)


def test_empty_list_gives_empty_result(minilm):
    assert minilm.encode([], calibration=CAL).shape == (0, 384)
    assert tuple(minilm.encode([], convert_to_tensor=True).shape) == (0, 384)


def test_empty_text_is_an_error(minilm):
    with pytest.raises(ValueError, match="text 1 is empty"):
        minilm.encode(["fine", "  "])


def test_unknown_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        posfair.load_model(tmp_path / "nope")
    with pytest.raises(OSError, match="cannot load model"):
        posfair.load_model("no-such-org/no-such-model-posfair")


def test_invalid_calibration_for_the_model(minilm):
    with pytest.raises(ValueError, match=r"out of range.*6 layers"):
        minilm.encode(TEXTS, calibration=Calibration(layers=(2, 9)))
    with pytest.raises(TypeError, match="posfair.Calibration"):
        minilm.encode(TEXTS, calibration={"basket_size": 4})


def test_max_seq_length_validation():
    with pytest.raises(ValueError, match=r"max_seq_length must be in \[4, 512\]"):
        posfair.load_model(max_seq_length=4096)
    assert posfair.load_model(max_seq_length=512).max_seq_length == 512


def test_truncation_warns_once_per_call_and_truncates_like_st(minilm):
    too_long = ["word " * 400, "word " * 300, "short"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ours = minilm.encode(too_long, calibration=STOCK)
    msgs = [w for w in caught if "longer than max_seq_length" in str(w.message)]
    assert len(msgs) == 1 and "2 of 3 texts" in str(msgs[0].message)
    plain = SentenceTransformer.encode(minilm, too_long)
    np.testing.assert_allclose(ours, plain, atol=0)


def test_fingerprint_identifies_weights(tiny_model_path, minilm):
    a = posfair.load_model(tiny_model_path("bert")[0], pooling="cls")
    b = posfair.load_model(tiny_model_path("bert")[0], pooling="cls")
    assert a.fingerprint == b.fingerprint != minilm.fingerprint
    other, _ = build_tiny_model("bert", tiny_model_path("bert")[0].parent / "seed1", seed=1)
    assert posfair.load_model(other, pooling="cls").fingerprint != a.fingerprint


def test_per_call_calibration_refused_for_multi_process(minilm):
    with pytest.raises(ValueError, match="model.set_calibration"):
        minilm.encode(TEXTS, calibration=CAL, device=["cpu", "cpu"])


def test_default_calibration_survives_pickling(tmp_path):
    model = posfair.load_model()
    model.set_calibration(CAL)
    want = model.encode(TEXTS)
    clone = pickle.loads(pickle.dumps(model))
    np.testing.assert_allclose(clone.encode(TEXTS), want, atol=1e-6)


def test_fingerprint_follows_the_token_limit(minilm):
    before = minilm.fingerprint
    old = minilm.max_seq_length
    try:
        minilm.max_seq_length = 128
        assert minilm.fingerprint != before
    finally:
        minilm.max_seq_length = old
    assert minilm.fingerprint == before


def test_saved_without_calibration_is_a_plain_st_folder(tmp_path, minilm):
    minilm.save(str(tmp_path / "plain"))
    assert "posfair" not in (tmp_path / "plain" / "modules.json").read_text()
    np.testing.assert_allclose(
        SentenceTransformer(str(tmp_path / "plain")).encode(TEXTS), minilm.encode(TEXTS), atol=1e-6
    )
    reloaded = posfair.load_model(tmp_path / "plain")
    assert reloaded.calibration is STOCK
    np.testing.assert_allclose(
        reloaded.encode(TEXTS, calibration=CAL), minilm.encode(TEXTS, calibration=CAL), atol=1e-6
    )


def test_encode_follows_sentence_transformers_signature(minilm):
    """Texts by position or by either of sentence-transformers' names; positional arguments in its order;
    encode_query / encode_document (what MTEB calls) go through the model's default calibration."""
    by_name = minilm.encode(inputs=TEXTS, calibration=CAL)
    np.testing.assert_allclose(minilm.encode(sentences=TEXTS, calibration=CAL), by_name, atol=1e-6)
    np.testing.assert_allclose(minilm.encode(TEXTS, calibration=CAL), by_name, atol=1e-6)
    # prompt_name, prompt, batch_size by position, as in SentenceTransformer.encode
    np.testing.assert_allclose(
        minilm.encode(TEXTS, None, "query: ", 2), minilm.encode(TEXTS, prompt="query: "), atol=1e-6
    )
    with pytest.raises(TypeError, match="twice"):
        minilm.encode(TEXTS, sentences=TEXTS)
    with pytest.raises(TypeError, match="multiple values"):
        minilm.encode(TEXTS, None, "query: ", prompt="other: ")
    try:
        minilm.set_calibration(CAL)
        np.testing.assert_allclose(minilm.encode_document(TEXTS), by_name, atol=1e-6)
        np.testing.assert_allclose(minilm.encode_query(TEXTS), by_name, atol=1e-6)
    finally:
        minilm.set_calibration(STOCK)
    assert np.abs(minilm.encode_document(TEXTS) - by_name).max() > 1e-3
