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


def test_none_uses_default_false_forces_stock(minilm, tmp_path):
    stock = minilm.encode(TEXTS)
    try:
        minilm.set_calibration(CAL)
        np.testing.assert_allclose(minilm.encode(TEXTS), minilm.encode(TEXTS, calibration=CAL), atol=1e-6)
        np.testing.assert_allclose(minilm.encode(TEXTS, calibration=False), stock, atol=1e-6)
    finally:
        minilm.set_calibration(None)
    np.testing.assert_allclose(minilm.encode(TEXTS), stock, atol=1e-6)


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
    np.testing.assert_allclose(again.encode(TEXTS, calibration=False), stock, atol=1e-6)


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
        ours = minilm.encode(too_long, calibration=False)
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
    np.testing.assert_allclose(SentenceTransformer(str(tmp_path / "plain")).encode(TEXTS), minilm.encode(TEXTS), atol=1e-6)
    reloaded = posfair.load_model(tmp_path / "plain")
    assert reloaded.calibration is None
    np.testing.assert_allclose(reloaded.encode(TEXTS, calibration=CAL), minilm.encode(TEXTS, calibration=CAL), atol=1e-6)


def test_encode_follows_sentence_transformers_signature(minilm):
    """Texts by position or by either of sentence-transformers' names; positional arguments in its order;
    encode_query / encode_document (what MTEB calls) go through the model's default calibration."""
    by_name = minilm.encode(inputs=TEXTS, calibration=CAL)
    np.testing.assert_allclose(minilm.encode(sentences=TEXTS, calibration=CAL), by_name, atol=1e-6)
    np.testing.assert_allclose(minilm.encode(TEXTS, calibration=CAL), by_name, atol=1e-6)
    # prompt_name, prompt, batch_size by position, as in SentenceTransformer.encode
    np.testing.assert_allclose(minilm.encode(TEXTS, None, "query: ", 2), minilm.encode(TEXTS, prompt="query: "), atol=1e-6)
    with pytest.raises(TypeError, match="twice"):
        minilm.encode(TEXTS, sentences=TEXTS)
    with pytest.raises(TypeError, match="multiple values"):
        minilm.encode(TEXTS, None, "query: ", prompt="other: ")
    try:
        minilm.set_calibration(CAL)
        np.testing.assert_allclose(minilm.encode_document(TEXTS), by_name, atol=1e-6)
        np.testing.assert_allclose(minilm.encode_query(TEXTS), by_name, atol=1e-6)
    finally:
        minilm.set_calibration(None)
    assert np.abs(minilm.encode_document(TEXTS) - by_name).max() > 1e-3
