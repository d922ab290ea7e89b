"""Estimating the positional prior of positional-prior calibration from the stock model's attention.

:func:`estimate_prior` runs the *stock* model over calibration documents, records the
calibrated query rows of every calibrated layer (the pooling token's row for CLS /
last-token pooling; the mean over valid query rows for ``queries="all"``, as the
attention profile records them), averages over heads, and summarises each document's row
as a density over ``bins`` equal bins of relative *content* position: the content keys
are the calibration's own (its BOS / EOS isolation, so the prior sees exactly the keys the
baskets will hold), key ``i`` of ``C`` falls into bin ``floor((i + 0.5) / C * bins)``, and a
bin's value is its share of the row's content mass divided by its share of the content
keys (1 everywhere for a row spread evenly).  Documents with fewer than ``bins`` content
keys are left out (some of their bins would be empty); every remaining document weighs
the same.  The prior is the mean density per bin and layer (one vector per calibrated
layer), returned inside a :class:`~posfair.Calibration`
(:class:`~posfair.calibration.params.PositionalPrior`), so it is saved with the calibration.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import torch

from posfair.calibration.choice import STOCK
from posfair.calibration.params import Calibration, PositionalPrior
from posfair.encoding import model_tokenizer
from posfair.encoding.passes import forward_pass
from posfair.model import FairModel
from posfair.runtime.errors import PosfairInputError

__all__ = ["PriorEstimate", "estimate_prior", "row_density"]

log = logging.getLogger(__name__)


def row_density(content: np.ndarray, bins: int) -> np.ndarray:
    """One row's density over ``bins`` relative-position bins (see the module docstring).

    ``content``: (..., C) masses of the content keys, ``C >= bins``; returns (..., bins) whose
    mean over bins is 1 for a row of positive mass (all zeros for a row of zero mass)."""
    content = np.asarray(content, dtype=np.float64)
    C = content.shape[-1]
    if C < bins:
        raise ValueError(f"a row of {C} content keys cannot fill {bins} bins")
    idx = np.floor((np.arange(C) + 0.5) / C * bins).astype(np.int64)
    total = content.sum(-1, keepdims=True)
    share = np.where(total > 0, content / np.where(total > 0, total, 1.0), 0.0)
    onehot = (idx[:, None] == np.arange(bins)[None, :]).astype(np.float64)  # (C, bins)
    mass = share @ onehot
    keys = onehot.sum(0) / C
    return mass / keys


@dataclasses.dataclass(frozen=True)
class PriorEstimate:
    """What :func:`estimate_prior` returns: the calibration carrying the prior and how it was measured."""

    calibration: Calibration
    documents: int  # documents that entered the prior
    skipped: int  # documents with fewer content keys than bins

    def to_dict(self) -> dict:
        return {
            "calibration": self.calibration.to_dict(),
            "prior": self.calibration.prior.to_dict(),
            "documents": self.documents,
            "skipped": self.skipped,
        }


#: the calibration a prior is estimated for when none is given (the default one)
DEFAULT_TEMPLATE = Calibration()


def estimate_prior(
    model: FairModel,
    documents: Sequence[str],
    calibration: Calibration = DEFAULT_TEMPLATE,
    *,
    bins: int = 20,
    batch_size: int = 8,
) -> PriorEstimate:
    """Estimate ``model``'s positional prior on ``documents`` for ``calibration`` (default ``Calibration()``).

    Returns a :class:`PriorEstimate` whose ``calibration`` is ``calibration`` with
    ``prior`` set (one vector per layer it calibrates).  Raises
    :class:`~posfair.runtime.errors.PosfairInputError` when no document has ``bins`` content keys.
    """
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise PosfairInputError(f"bins must be an integer >= 1; got {bins!r}")
    if not isinstance(calibration, Calibration):
        raise TypeError(f"calibration must be a posfair.Calibration (the one the prior is for); got {calibration!r}")
    base = dataclasses.replace(calibration, prior=None)
    resolved = model.transformer_module.resolve(base)
    layers = list(resolved.layers)
    texts = [str(t) for t in documents]
    if not texts:
        raise PosfairInputError("estimate_prior needs at least one document")
    limit = model.max_seq_length or model.position_limit
    buffer: dict[int, np.ndarray] = {}

    def recorder(layer: int, rows: torch.Tensor) -> None:
        buffer[layer] = rows.float().mean(1).double().cpu().numpy()  # (B, K), head-averaged

    sums = np.zeros((len(layers), bins))
    used = skipped = 0
    device = next(model.parameters()).device
    tok = model_tokenizer(model)  # the model's default prompt in front, as encode has it
    with torch.no_grad(), model.using(STOCK), model.recording_attention(recorder, layers, queries=resolved.queries):
        for b0 in range(0, len(texts), batch_size):
            batch = texts[b0 : b0 + batch_size]
            enc = tok(batch, padding=True, truncation=True, max_length=limit, return_tensors="pt")
            features = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            features["modality"] = "text"
            buffer.clear()
            forward_pass(model, features, device)  # stock, under the attention recorder
            mask = enc["attention_mask"].numpy().astype(bool)
            for j in range(len(batch)):
                valid = np.nonzero(mask[j])[0]
                s, e = int(valid[0]) + int(resolved.isolate_bos), int(valid[-1]) - int(resolved.isolate_eos)
                if e - s + 1 < bins:
                    skipped += 1
                    continue
                for li, layer in enumerate(layers):
                    sums[li] += row_density(buffer[layer][j, s : e + 1], bins)
                used += 1
    if used == 0:
        raise PosfairInputError(
            f"no document has {bins} content keys: the prior cannot be estimated (use fewer bins or longer documents)"
        )
    if skipped:
        log.warning(
            "positional prior: %d of %d documents have fewer than %d content keys and were left out",
            skipped,
            len(texts),
            bins,
        )
    mean = sums / used
    mean = np.maximum(mean, 1e-6)  # a bin no row attends to would divide by 0
    prior = PositionalPrior(values=tuple(tuple(float(x) for x in v) for v in mean), layers=tuple(layers))
    return PriorEstimate(dataclasses.replace(base, prior=prior), used, skipped)
