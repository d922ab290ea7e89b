"""Every forward pass of a model runs in ``posfair.encoding.passes``: no module of ``src/posfair`` calls a model on
features itself (``model(features)``, ``self.model(f)``, ``model.forward(...)``, ``model[0](...)``,
``transformer(...)``, ``auto_model(...)``), read with :mod:`ast`.

tests/test_architecture.py::test_one_module_runs_the_forward_passes finds the ``encode`` calls; this finds the
direct passes, which it does not see (the fitted calibration's training and the attention profile and prior
estimate ran their own, now through :func:`posfair.encoding.passes.forward_pass`).  The calls left elsewhere are
listed below, each with why it is no forward pass of posfair's own.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "posfair"
SEAM = "posfair.encoding.passes"

#: the names a model is called by (a call of one of them, of its ``forward`` or ``__call__``, or of an item of it)
MODEL_NAMES = frozenset({"model", "auto_model", "transformer", "transformer_module", "st_model", "fair_model"})

#: (module, call) left outside the seam, and why: the model's own machinery, inside every pass (not a pass of its
#: own), and a training loss sentence-transformers' Trainer calls
ALLOWED = {
    ("posfair.model.calibrated_transformer", "super().forward(features, **kwargs)"): (
        "the calibrated Transformer module's forward calling sentence-transformers' own: it is the model's pass"
    ),
    ("posfair.model.calibrated_transformer", "model(**inputs)"): (
        "the module's one probe of its Hugging Face model (which route calibrates it), before any pass"
    ),
    ("posfair.calibration.transformers4", "base.forward(self, hidden_states, attention_mask, *args, **kwargs)"): (
        "an attention layer's patched forward calling the layer's own, inside a pass"
    ),
    ("posfair.repair.finetune", "self.model(f)"): (
        "sentence-transformers' Trainer calls the loss with the features it batched and trains through the pass"
    ),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _called_name(func: ast.expr) -> str | None:
    """The name a call's callee ends in (``model`` of ``self.model`` and ``model[0]``), else None."""
    if isinstance(func, ast.Subscript):
        func = func.value
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def forward_calls(source: str) -> list[tuple[int, str]]:
    """(line, call) of each direct forward pass in ``source``: a call of a model (:data:`MODEL_NAMES`, or an item of
    one), or of anything's ``forward`` / ``__call__``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        method = isinstance(node.func, ast.Attribute) and node.func.attr in ("forward", "__call__")
        if method or _called_name(node.func) in MODEL_NAMES:
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def direct_passes() -> dict[str, list[tuple[int, str]]]:
    """Every module's direct passes but the seam's and the allowed ones."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        calls = [(n, c) for n, c in forward_calls(path.read_text(encoding="utf-8")) if (module, c) not in ALLOWED]
        if module != SEAM and calls:
            found[module] = calls
    return found


def test_the_reader_finds_a_direct_forward_pass():
    """The reader finds what it looks for, and not a function of a model or a pass through the seam."""
    for passes in (
        "model(features)",
        "out = self.model(f)['sentence_embedding']",
        "model.forward(features)",
        "model[0](features)",
        "self.transformer(x)",
        "tm.auto_model(**inputs)",
        "torch.nn.Module.__call__(model, features)",
    ):
        assert len(forward_calls(passes)) == 1, passes
    for none in ("load_model(x)", "model_tokenizer(model)", "passes.forward_pass(model, f)", "model.encode(t)"):
        assert forward_calls(none) == [], none
    seam = (PACKAGE / "encoding" / "passes.py").read_text(encoding="utf-8")
    assert [c for _, c in forward_calls(seam)] == ["model(moved)"]  # forward_pass's one pass


def test_every_direct_forward_pass_runs_in_the_encoding_passes():
    """No module runs a model on features but posfair.encoding.passes (the allowed calls aside, each with its
    reason); a new ``model(features)`` anywhere else fails here."""
    assert direct_passes() == {}
    for (module, call), reason in ALLOWED.items():  # each allowed call is still there (a stale entry is removed)
        path = PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")
        assert call in [c for _, c in forward_calls(path.read_text(encoding="utf-8"))], (module, call, reason)
