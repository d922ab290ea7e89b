"""posfair's warnings point at the caller's line (issue 40 item 5), and saving a calibrated model warns about no
text the user never gave (sentence-transformers' model card encodes its own examples)."""

from __future__ import annotations

import warnings

import posfair
from posfair import Calibration
from posfair.calibration import STOCK
from posfair.calibration.coverage import CalibrationFallbackWarning

CAL = Calibration(basket_size=64, layers=0.5, strength=1.0)  # a short text is shorter than one basket: stock


def _recorded(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return caught


def test_encode_warnings_point_at_the_callers_line(tiny_model):
    model = tiny_model("bert")
    long_text = "word " * (model.max_seq_length + 20)
    caught = _recorded(lambda: model.encode([long_text, "short"], calibration=STOCK))
    truncation = [w for w in caught if "longer than max_seq_length" in str(w.message)]
    assert len(truncation) == 1 and truncation[0].filename == __file__
    caught = _recorded(lambda: model.encode(["a short text"], calibration=CAL))
    fallback = [w for w in caught if issubclass(w.category, CalibrationFallbackWarning)]
    assert len(fallback) == 1 and fallback[0].filename == __file__


def test_a_pipeline_warning_points_at_the_callers_line(tiny_model):
    """A warning raised several posfair frames deep (the encoding pipeline) still names the caller's file."""
    from posfair.encoding import encode_cached

    model = tiny_model("bert")
    caught = _recorded(lambda: encode_cached(model, ["a short text", "another one"], calibration=CAL))
    fallback = [w for w in caught if issubclass(w.category, CalibrationFallbackWarning)]
    assert fallback and {w.filename for w in fallback} == {__file__}


def test_saving_a_calibrated_model_warns_about_no_text_the_user_never_gave(tiny_model_path, tmp_path):
    path, pooling = tiny_model_path("bert")
    model = posfair.load_model(path, pooling=pooling).set_calibration(CAL)
    caught = _recorded(lambda: model.save(str(tmp_path / "saved")))
    assert [str(w.message) for w in caught if issubclass(w.category, CalibrationFallbackWarning)] == []
    assert (tmp_path / "saved" / "README.md").exists()  # the model card is still written
    # the calibration would warn on such short texts of the user's own: the silence above is the card's texts only
    caught = _recorded(lambda: model.encode(["The weather is lovely today."]))
    assert [w for w in caught if issubclass(w.category, CalibrationFallbackWarning)]
