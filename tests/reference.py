"""Independent slow references for calibration, written from the spec, not from posfair's code.

- :func:`reference_calibrate_row`: one row, plain Python/NumPy loops over baskets.
- :func:`reference_attention`: an attention function for transformers' registry
  that computes the full eager attention matrix, calibrates the chosen rows with
  :func:`reference_calibrate_row` (float64), and multiplies by V.
- For models whose attention does not go through the registry (BERT / XLM-RoBERTa /
  ModernBERT on transformers 4.x), :func:`reference_mode` wraps each layer's attention
  module and replaces its ``scaled_dot_product_attention`` call by the same float64
  computation, or calibrates the chosen rows of its eager softmax weights (float64).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

REF_NAME = "posfair_test_reference"


def reference_prior(density, x):
    """The prior density (bin r centred at (r + 0.5) / R) at relative position x: linear between centres, flat outside."""
    R = len(density)
    centres = [(r + 0.5) / R for r in range(R)]
    if x <= centres[0]:
        return float(density[0])
    if x >= centres[-1]:
        return float(density[-1])
    for r in range(R - 1):
        if centres[r] <= x <= centres[r + 1]:
            t = (x - centres[r]) / (centres[r + 1] - centres[r])
            return float(density[r]) * (1 - t) + float(density[r + 1]) * t
    raise AssertionError(x)


def reference_calibrate_row(a, s, e, B, alpha=1.0, iso_bos=False, iso_eos=False, bos_w="original", eos_w="equal",
                            prior=None, self_share=None, self_key=None, trailing="basket"):  # fmt: skip
    """One row, from the spec.  ``prior``: divide each basket's mass by the prior at the basket's
    centre and give the content its mass back; ``self_share`` rho with ``self_key`` q: the own key keeps
    rho * a[q], the rest is calibrated with a[q] = 0 and rescaled to 1 - rho * a[q].  ``trailing``:
    ``"merge"`` appends a last basket shorter than B to the basket before it; ``"weighted"`` gives
    each basket ``len(basket) / B`` basket units (the target mass per unit is what one basket gets)."""
    a = np.asarray(a, dtype=np.float64)
    if self_share is not None and s <= self_key <= e:
        iso_n = int(iso_bos) + int(iso_eos)
        if (e - s + 1) - iso_n < B:
            return a.copy()
        rest = a.copy()
        rest[self_key] = 0.0
        rest = reference_calibrate_row(rest, s, e, B, 1.0, iso_bos, iso_eos, bos_w, eos_w, prior, trailing=trailing)
        rest[self_key] = 0.0
        keep = self_share * a[self_key]
        cal = rest / rest.sum() * (1 - keep) if rest.sum() > 0 else np.zeros_like(a)
        cal[self_key] = keep
        cal = cal / cal.sum() if cal.sum() > 0 else a.copy()
        return alpha * cal + (1 - alpha) * a
    iso = []
    if iso_bos:
        iso.append((s, bos_w))
    if iso_eos:
        iso.append((e, eos_w))
    iso_keys = {k for k, _ in iso}
    content = [k for k in range(s, e + 1) if k not in iso_keys]
    if iso_bos and iso_eos and s == e:
        content = []
    if len(content) < B:
        return a.copy()
    baskets = [content[i : i + B] for i in range(0, len(content), B)]
    if trailing == "merge" and len(baskets) > 1 and len(baskets[-1]) < B:
        baskets = baskets[:-2] + [baskets[-2] + baskets[-1]]
    # basket units: one per basket, or (weighted) the basket's share of a full basket
    units = [len(b) / B if trailing == "weighted" else 1.0 for b in baskets]
    n_total = sum(units) + len(iso)
    shares = {}
    for k, w in iso:
        shares[k] = 1.0 / n_total if w == "equal" else (a[k] if w == "original" else float(w))
    per_unit = max(0.0, (1.0 - sum(shares.values())) / sum(units))
    cal = np.zeros_like(a)
    if prior is not None:  # basket mass m / p(centre), content rescaled to the mass the isolated keys leave
        C = len(content)
        targets = []
        for b in baskets:
            first, last = content.index(b[0]), content.index(b[-1])  # content positions
            centre = (first + last) / 2
            targets.append(a[b].sum() / reference_prior(prior, (centre + 0.5) / C))
        left = max(0.0, 1.0 - sum(shares.values()))
        for b, t in zip(baskets, targets, strict=True):
            m = a[b].sum()
            if m > 0:
                cal[b] = a[b] / m * t / sum(targets) * left
        baskets = []
    for b, u in zip(baskets, units, strict=False):  # (baskets is emptied by the prior)
        m = a[b].sum()
        if m > 0:
            cal[b] = a[b] / m * per_unit * u
    for k, v in shares.items():
        cal[k] = v
    cal = cal / cal.sum()
    return alpha * cal + (1 - alpha) * a


class Reference:
    """Holds what the reference attention needs for one forward pass."""

    def __init__(self):
        self.cal = None  # a ResolvedCalibration
        self.start = self.end = None  # per-sequence valid spans (numpy)

    def attention(self, module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        B, H, L, D = query.shape
        rep = H // key.shape[1]
        k = key.repeat_interleave(rep, dim=1).double()
        v = value.repeat_interleave(rep, dim=1).double()
        scores = torch.matmul(query.double(), k.transpose(-1, -2)) * (scaling if scaling is not None else D**-0.5)
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attention_mask, float("-inf"))
            else:
                scores = scores + attention_mask.double()
        T = getattr(self.cal, "temperature", None)
        tempered = None  # TempScale: softmax(scores / T), from the scores (not from the probabilities)
        if T is not None:
            tempered = torch.nan_to_num(torch.softmax(scores / T, dim=-1), nan=0.0).numpy()
        w = self.calibrate_weights(
            torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0).numpy().copy(), module.layer_idx, tempered
        )
        out = torch.matmul(torch.from_numpy(w), v)
        return out.transpose(1, 2).contiguous().to(query.dtype), None

    def calibrate_weights(self, w: np.ndarray, layer: int, tempered: np.ndarray | None = None) -> np.ndarray:
        """Calibrate (in place, float64) the chosen rows of post-softmax weights ``w`` (B, H, L, K).  With a
        temperature T, a row whose content fills a basket is first replaced by ``tempered`` (softmax(scores / T));
        without ``tempered`` (an eager softmax route: only its output is seen) by ``w ** (1 / T)`` renormalised."""
        cal = self.cal
        if cal is not None and layer in cal.layers:
            B, H = w.shape[:2]
            for b in range(B):
                s, e = int(self.start[b]), int(self.end[b])
                if cal.queries == "all":
                    rows = range(s, e + 1)
                else:
                    rows = [e if cal.pooling == "lasttoken" else s]
                prior = cal.prior.density(layer) if getattr(cal, "prior", None) is not None else None
                self_share = getattr(cal, "self_share", None)
                trailing = getattr(cal, "trailing", "basket")
                T = getattr(cal, "temperature", None)
                content = (e - s + 1) - int(cal.isolate_bos) - int(cal.isolate_eos)
                for h in range(H):
                    strength = reference_head_strength(cal, layer, h)
                    for r in rows:
                        if T is not None and content >= cal.basket_size:
                            if tempered is not None:
                                w[b, h, r] = tempered[b, h, r]
                            else:
                                w[b, h, r] = w[b, h, r] ** (1.0 / T) / (w[b, h, r] ** (1.0 / T)).sum()
                        w[b, h, r] = reference_calibrate_row(
                            w[b, h, r],
                            s,
                            e,
                            cal.basket_size,
                            strength,
                            cal.isolate_bos,
                            cal.isolate_eos,
                            cal.bos_weight,
                            cal.eos_weight,
                            prior=prior,
                            self_share=self_share,
                            self_key=r,
                            trailing=trailing,
                        )
        return w


_REF = Reference()
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
_SOFTMAXES = (F.softmax, torch.softmax, torch.Tensor.softmax)


class _LayerReference(TorchFunctionMode):
    """Inside one layer's attention module: SDPA -> the float64 reference; eager softmax weights ->
    their chosen rows calibrated in float64.  Counts the attention calls it replaced."""

    def __init__(self, layer: int, batch: int):
        super().__init__()
        self.layer, self.batch, self.calls = layer, batch, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            a = dict(zip(_SDPA_ARGS, args, strict=False), **kwargs)  # positional arguments, then keywords
            assert not a.get("is_causal"), "the reference handles encoders' SDPA calls only"
            self.calls += 1
            mod = type("Layer", (), {"layer_idx": self.layer})()
            out, _ = _REF.attention(mod, a["query"], a["key"], a["value"], a.get("attn_mask"), scaling=a.get("scale"))
            return out.transpose(1, 2)
        out = func(*args, **kwargs)
        if (
            any(func is f for f in _SOFTMAXES)
            and out.dim() == 4
            and out.shape[0] == self.batch
            and out.shape[-1] == out.shape[-2]
        ):
            self.calls += 1
            w = self.calibrate_weights(out)
            return w
        return out

    def calibrate_weights(self, out: torch.Tensor) -> torch.Tensor:
        w = _REF.calibrate_weights(out.detach().double().numpy().copy(), self.layer)
        return torch.from_numpy(w).to(out.dtype)


def layer_attention_modules(auto_model, num_layers: int) -> list:
    """Each layer's attention module: the first submodule named "...Attention" in each entry of
    the model's stack of ``num_layers`` layers."""
    for stack in auto_model.modules():
        if isinstance(stack, torch.nn.ModuleList) and len(stack) == num_layers:
            mods = [
                next((m for m in layer.modules() if type(m).__name__.endswith("Attention")), None) for layer in stack
            ]
            if all(m is not None for m in mods):
                return mods
    raise AssertionError(f"no layer stack with attention modules in {type(auto_model).__name__}")


@contextlib.contextmanager
def _wrapped_attention(auto_model, num_layers: int, batch: int):
    mods = layer_attention_modules(auto_model, num_layers)
    modes = [_LayerReference(i, batch) for i in range(num_layers)]

    def wrap(mod, mode):
        inner = type(mod).forward.__get__(mod)

        def forward(*args, **kwargs):
            with mode:
                return inner(*args, **kwargs)

        return forward

    for mod, mode in zip(mods, modes, strict=True):
        mod.forward = wrap(mod, mode)
    try:
        yield modes
    finally:
        for mod in mods:
            del mod.forward
    assert all(m.calls == 1 for m in modes), f"attention calls per layer: {[m.calls for m in modes]}"


def _register():
    AttentionInterface.register(REF_NAME, _REF.attention)
    AttentionMaskInterface.register(REF_NAME, eager_mask)


@contextlib.contextmanager
def reference_mode(model, resolved, attention_mask):
    """Run ``model`` (a FairModel) with the reference attention and calibration ``resolved``."""
    _register()
    tm = model.transformer_module
    auto = tm.auto_model
    m = attention_mask.bool().numpy()
    pos = np.arange(m.shape[1])
    _REF.cal = resolved
    _REF.start = np.where(m, pos, m.shape[1]).min(1)
    _REF.end = np.where(m, pos, -1).max(1)
    try:
        if tm.mechanism == "fallback":  # the attention does not reach the registry (e.g. BERT on transformers 4.x)
            with _wrapped_attention(auto, tm.num_layers, m.shape[0]):
                yield
            return
        before = auto.config._attn_implementation
        auto.set_attn_implementation(REF_NAME)
        try:
            yield
        finally:
            auto.set_attn_implementation(before)
    finally:
        _REF.cal = None


def reference_layer_strength(cal, layer: int) -> float:
    """The strength the reference uses in ``layer``, written out from the definition: with K calibrated layers
    in ascending order and ``layer`` the k-th (1-based), "rising" gives alpha k / K, "falling" alpha (K - k + 1) / K,
    "flat" alpha."""
    schedule = getattr(cal, "schedule", "flat")
    ordered = sorted(cal.layers)
    k, K = ordered.index(layer) + 1, len(ordered)
    return {"flat": cal.strength, "rising": cal.strength * k / K, "falling": cal.strength * (K - k + 1) / K}[schedule]


def reference_head_strength(cal, layer: int, head: int) -> float:
    """The strength of head ``head`` in ``layer``: its per-head strength where ``head_strengths`` names the layer,
    else the layer's (:func:`reference_layer_strength`)."""
    for i, values in getattr(cal, "head_strengths", None) or ():
        if i == layer:
            return float(values[head])
    return reference_layer_strength(cal, layer)


def fast_and_reference(model, texts, cal):
    """(posfair's sentence embeddings of ``texts`` under ``cal``, the same through the float64 reference)."""
    features = model.tokenize(texts)
    with torch.no_grad(), model.using(cal):
        fast = model(features)["sentence_embedding"]
    with torch.no_grad(), reference_mode(model, model.transformer_module.resolve(cal), features["attention_mask"]):
        ref = model(model.tokenize(texts))["sentence_embedding"]
    return fast, ref
