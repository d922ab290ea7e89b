"""Independent slow references for calibration, written from the spec, not from posfair's code.

- :func:`reference_calibrate_row`: one row, plain Python/NumPy loops over baskets.
- :func:`reference_attention`: an attention function for transformers' registry
  that computes the full eager attention matrix, calibrates the chosen rows with
  :func:`reference_calibrate_row` (float64), and multiplies by V.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

REF_NAME = "posfair_test_reference"


def reference_calibrate_row(a, s, e, B, alpha=1.0, iso_bos=False, iso_eos=False, bos_w="original", eos_w="equal"):
    a = np.asarray(a, dtype=np.float64)
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
    n_total = len(baskets) + len(iso)
    shares = {}
    for k, w in iso:
        shares[k] = 1.0 / n_total if w == "equal" else (a[k] if w == "original" else float(w))
    each = max(0.0, (1.0 - sum(shares.values())) / len(baskets))
    cal = np.zeros_like(a)
    for b in baskets:
        m = a[b].sum()
        if m > 0:
            cal[b] = a[b] / m * each
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
        w = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0).numpy().copy()
        cal = self.cal
        if cal is not None and module.layer_idx in cal.layers:
            for b in range(B):
                s, e = int(self.start[b]), int(self.end[b])
                if cal.queries == "all":
                    rows = range(s, e + 1)
                else:
                    rows = [e if cal.pooling == "lasttoken" else s]
                for h in range(H):
                    for r in rows:
                        w[b, h, r] = reference_calibrate_row(
                            w[b, h, r], s, e, cal.basket_size, cal.strength,
                            cal.isolate_bos, cal.isolate_eos, cal.bos_weight, cal.eos_weight,
                        )
        out = torch.matmul(torch.from_numpy(w), v)
        return out.transpose(1, 2).contiguous().to(query.dtype), None


_REF = Reference()


def _register():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(REF_NAME, _REF.attention)
    AttentionMaskInterface.register(REF_NAME, eager_mask)


@contextlib.contextmanager
def reference_mode(model, resolved, attention_mask):
    """Run ``model`` (a FairModel) with the reference attention and calibration ``resolved``."""
    _register()
    auto = model.transformer_module.auto_model
    before = auto.config._attn_implementation
    m = attention_mask.bool().numpy()
    pos = np.arange(m.shape[1])
    _REF.cal = resolved
    _REF.start = np.where(m, pos, m.shape[1]).min(1)
    _REF.end = np.where(m, pos, -1).max(1)
    auto.set_attn_implementation(REF_NAME)
    try:
        yield
    finally:
        auto.set_attn_implementation(before)
        _REF.cal = None
