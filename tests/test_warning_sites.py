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


def _warn_calls():
    """Every ``warnings.warn(...)`` call in posfair's library code (not the command line's own): (file:line, its
    stacklevel argument as source text or None)."""
    import ast
    from pathlib import Path

    src = Path(posfair.__file__).parent
    for path in sorted(src.rglob("*.py")):
        if "cli" in path.relative_to(src).parts:
            continue  # a command's warning is printed as one line by the error boundary, wherever it points
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            f = node.func if isinstance(node, ast.Call) else None
            if isinstance(f, ast.Attribute) and f.attr == "warn" and getattr(f.value, "id", None) == "warnings":
                level = next((k.value for k in node.keywords if k.arg == "stacklevel"), None)
                yield f"{path.relative_to(src)}:{node.lineno}", None if level is None else ast.unparse(level)


def test_every_library_warning_points_at_the_callers_line():
    """Structural: each warnings.warn of the library passes stacklevel=user_stacklevel() (issue 49 item 4), so a
    warning raised however deep names the user's line, in the Python API as the command line names it."""
    wrong = [(where, level) for where, level in _warn_calls() if level != "user_stacklevel()"]
    assert not wrong, wrong


def test_the_few_clusters_warning_of_an_audit_points_at_the_callers_line(tiny_model):
    from posfair import AuditSettings, audit
    from posfair.corpus import load_corpus
    from posfair.stats.inference import FewClustersWarning

    settings = AuditSettings(n_values=(2,), target_docs=4, seed=0)
    caught = _recorded(lambda: audit(tiny_model("bert"), load_corpus(), settings))
    few = [w for w in caught if issubclass(w.category, FewClustersWarning)]
    assert few and {w.filename for w in few} == {__file__}, [(w.filename, w.lineno) for w in few]
