"""Calibration fitted on permuted segment sets: per-head strengths by gradient (:func:`fit_learned`) and TempScale's
temperature chosen on dev (:func:`fit_tempscale`).  Both return a plain :class:`~posfair.Calibration`
(``head_strengths`` / ``temperature`` as numbers) that ``FairModel.set_calibration(cal).save(DIR)`` writes into
``config.json`` and ``posfair.load_model(DIR)`` reloads.

**The objective** (:class:`SigmaObjective`), on documents built from permuted segment sets (a document's
``texts`` are its segments in document order): ``sigma_p = cos(standalone embedding of the segment at position p,
document embedding)``, both encoded as the saved model encodes them (the same calibration; a segment shorter than
one basket is encoded stock, by the engine's own rule).

* *balance*: the variance over positions ``p`` of the mean ``sigma_p`` (over the documents, every ordering of a set
  present, so the segments' own content averages out), divided by the same quantity for the stock model on the dev
  documents (1 = as unbalanced as stock, 0 = every position alike);
* *keep*: own-segment retrieval, in-batch contrastive: for each (document, own segment) pair the cross-entropy
  ``-log softmax(cos / tau)`` of the own segment against every foreign segment of the batch (the document's other
  own segments left out), and the objective adds ``keep_weight`` times its mean increase over the stock model's
  (``relu(ce - ce_stock)``: only a loss of retrieval counts).

``objective = balance + keep_weight * keep`` (the stock model scores about 1 on dev).

**Learned strengths**: one strength per calibrated layer and head, ``sigmoid(theta)``, fitted with Adam through
posfair's explicit attention path (differentiable; the model's own weights are frozen), a few sets per step, with
early stopping on the dev documents (evaluated every ``eval_every`` steps with the plain-number calibration the fit
would return, through the fused kernels the saved model runs).  **TempScale** (Zhou et al., ACL 2025): the
temperature among ``temperatures`` with the lowest dev objective, the basket formula off (``strength=0``).

``progress(step, total, objective_value)`` (optional) is called after every step (training objective) and every
evaluated temperature.  No progress bar here: the command line draws one from the callback.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from posfair.calibration.choice import STOCK
from posfair.calibration.params import Calibration
from posfair.encoding import default_prompt
from posfair.encoding.passes import forward_pass
from posfair.model.calibrated_transformer import calibration_override
from posfair.model.compat import preprocess

__all__ = ["SigmaObjective", "TextBatch", "embed", "fit_learned", "fit_tempscale"]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class TextBatch:
    """Documents and their segments laid out for the objective: ``docs`` (D texts), ``segs`` (S distinct segment
    texts), and one entry per (document, position): ``pair_doc`` / ``pair_seg`` / ``pair_pos`` (P,) indices (the
    position 0-based), ``own`` (D, S) which segments each document holds."""

    docs: tuple[str, ...]
    segs: tuple[str, ...]
    pair_doc: torch.Tensor
    pair_seg: torch.Tensor
    pair_pos: torch.Tensor
    own: torch.Tensor

    @classmethod
    def of(cls, documents: Sequence[Any]) -> TextBatch:
        """From documents with ``.text`` and ``.texts`` (its segments in document order)."""
        segs: dict[str, int] = {}
        pd, ps, pp = [], [], []
        for d, doc in enumerate(documents):
            for p, seg in enumerate(doc.texts):
                ps.append(segs.setdefault(seg, len(segs)))
                pd.append(d)
                pp.append(p)
        pair_doc, pair_seg = torch.tensor(pd), torch.tensor(ps)
        own = torch.zeros(len(documents), len(segs), dtype=torch.bool)
        own[pair_doc, pair_seg] = True
        return cls(tuple(doc.text for doc in documents), tuple(segs), pair_doc, pair_seg, torch.tensor(pp), own)


def embed(model, texts: Sequence[str], batch_size: int | None = 16) -> torch.Tensor:
    """Sentence embeddings of ``texts`` from ``model``'s forward pass, the features as ``encode`` builds them (the
    model's default prompt, e.g. multilingual-e5's "passage: ", prepended), with the calibration active around the
    call (autograd tracks what it tracks); ``batch_size`` texts per pass (None: one pass)."""
    texts = list(texts)
    step = batch_size or max(1, len(texts))
    prompt = default_prompt(model) or None
    out = []
    for i in range(0, len(texts), step):
        out.append(forward_pass(model, preprocess(model, texts[i : i + step], prompt))["sentence_embedding"])
    return torch.cat(out)


class SigmaObjective:
    """The objective of the module docstring: :meth:`parts` (per pair: sigma and the cross-entropy), :meth:`balance`
    and :meth:`value`; ``balance_scale`` is the stock balance it divides by (the fits set it from the dev split)."""

    def __init__(self, tau: float = 0.05, keep_weight: float = 1.0, balance_scale: float = 1.0):
        if not tau > 0:
            raise ValueError(f"tau must be > 0; got {tau}")
        self.tau, self.keep_weight, self.balance_scale = float(tau), float(keep_weight), float(balance_scale)

    def parts(self, doc_emb: torch.Tensor, seg_emb: torch.Tensor, batch: TextBatch):
        """``(sigma, cross-entropy)``, each (P,): one per (document, position) pair of ``batch``."""
        doc, seg = F.normalize(doc_emb, dim=-1), F.normalize(seg_emb, dim=-1)
        pd, ps = batch.pair_doc.to(doc.device), batch.pair_seg.to(doc.device)
        sims = doc @ seg.T  # (D, S)
        sigma = sims[pd, ps]
        logits = sims[pd] / self.tau  # (P, S)
        candidates = ~batch.own.to(doc.device)[pd]
        candidates[torch.arange(len(ps), device=doc.device), ps] = True  # the own segment against foreign ones
        lse = torch.logsumexp(logits.masked_fill(~candidates, -math.inf), dim=-1)
        return sigma, lse - logits.gather(1, ps.unsqueeze(1)).squeeze(1)

    @staticmethod
    def balance(sigma: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The variance over positions of the mean sigma at each position (positions no pair holds left out)."""
        pos = pos.to(sigma.device)
        n = int(pos.max()) + 1
        count = torch.zeros(n, dtype=sigma.dtype, device=sigma.device).index_add(0, pos, torch.ones_like(sigma))
        mean = torch.zeros_like(count).index_add(0, pos, sigma) / count.clamp(min=1)
        present = count > 0
        return mean[present].var(unbiased=False)

    def value(self, sigma: torch.Tensor, pos: torch.Tensor, ce: torch.Tensor, ce_stock: torch.Tensor) -> torch.Tensor:
        """``balance(sigma, pos) / balance_scale + keep_weight * mean(relu(ce - ce_stock))``."""
        keep = torch.relu(ce - ce_stock.to(ce.device, ce.dtype)).mean()
        return self.balance(sigma, pos) / self.balance_scale + self.keep_weight * keep


@dataclass
class _Split:
    """One split's batches (a few sets each) and the stock model's cross-entropies per batch."""

    batches: list[TextBatch]
    ce_stock: list[torch.Tensor]
    stock_balance: float


def _sets(instances: Sequence[Any], docs_per_set: int | None, rng: random.Random) -> list[list[Any]]:
    """The documents of every set of every instance (at most ``docs_per_set`` orderings of a set, drawn)."""
    out = []
    for inst in instances:
        by_set: dict[str, list[Any]] = {}
        for doc in inst.documents:
            by_set.setdefault(doc.set_id, []).append(doc)
        for docs in by_set.values():
            if docs_per_set is not None and len(docs) > docs_per_set:
                docs = rng.sample(docs, docs_per_set)
            out.append(docs)
    return out


def _split(model, sets: list[list[Any]], sets_per_batch: int, objective: SigmaObjective, batch_size: int) -> _Split:
    """``sets`` in batches of ``sets_per_batch`` sets, with the stock model's parts (no gradient)."""
    batches = [
        TextBatch.of([d for s in sets[i : i + sets_per_batch] for d in s]) for i in range(0, len(sets), sets_per_batch)
    ]
    ce, sigma = [], []
    with torch.no_grad(), calibration_override(STOCK):
        for b in batches:
            sig, c = objective.parts(embed(model, b.docs, batch_size), embed(model, b.segs, batch_size), b)
            ce.append(c.float().cpu())
            sigma.append(sig.float().cpu())
    balance = SigmaObjective.balance(torch.cat(sigma), torch.cat([b.pair_pos for b in batches]))
    return _Split(batches, ce, float(balance))


def _evaluate(model, split: _Split, objective: SigmaObjective, cal: Calibration | None, batch_size: int) -> float:
    """The objective over every batch of ``split`` (documents and pairs weighted alike), ``cal`` encoding (None:
    stock), without gradient."""
    sigma, ces = [], []
    with torch.no_grad(), calibration_override(STOCK if cal is None else cal):
        for b in split.batches:
            sig, ce = objective.parts(embed(model, b.docs, batch_size), embed(model, b.segs, batch_size), b)
            sigma.append(sig.float().cpu())
            ces.append(ce.float().cpu())
    pos = torch.cat([b.pair_pos for b in split.batches])
    return float(objective.value(torch.cat(sigma), pos, torch.cat(ces), torch.cat(split.ce_stock)))


def _heads(model) -> int:
    config = model.transformer_module.auto_model.config
    for cfg in (config, getattr(config, "text_config", None)):
        n = getattr(cfg, "num_attention_heads", None) if cfg is not None else None
        if isinstance(n, int) and n > 0:
            return n
    raise ValueError(
        f"cannot tell the number of attention heads of {type(model.transformer_module.auto_model).__name__}"
    )


def _prepare(model, train_instances, dev_instances, cal: Calibration, *, docs_per_set, sets_per_batch, objective,
             batch_size, seed):  # fmt: skip
    """The dev and train splits, the objective's balance scale set to the stock dev balance; refuses documents
    the calibration would leave stock (counts in the message), logs how many segments it calibrates."""
    rng = random.Random(seed)
    train_sets = _sets(train_instances, docs_per_set, rng)
    dev_sets = _sets(dev_instances, docs_per_set, rng)
    if not train_sets or not dev_sets:
        raise ValueError(
            f"a fit needs train and dev documents; got {len(train_sets)} train and {len(dev_sets)} dev sets"
        )
    docs = [d.text for s in train_sets for d in s]
    segs = sorted({t for s in train_sets for d in s for t in d.texts})
    doc_cov = model.calibration_coverage(docs, cal)
    if doc_cov.noop:
        raise ValueError(f"the calibration changes none of the {doc_cov.total} training documents: {doc_cov.message()}")
    seg_cov = model.calibration_coverage(segs, cal)
    log.info(
        "fit on %d sets (%d documents, %d calibrated; %d segments, %d calibrated, the others encoded stock), %d dev sets",
        len(train_sets), doc_cov.total, doc_cov.calibrated, seg_cov.total, seg_cov.calibrated, len(dev_sets),
    )  # fmt: skip
    dev = _split(model, dev_sets, sets_per_batch, objective, batch_size)
    if not dev.stock_balance > 0:
        raise ValueError(
            "the stock model's sigma is the same at every position of the dev documents: nothing to balance"
        )
    objective.balance_scale = dev.stock_balance
    return _split(model, train_sets, sets_per_batch, objective, batch_size), dev


def _fitted(layers: Sequence[int], basket_size: int, strengths: torch.Tensor) -> Calibration:
    """The plain-number calibration of per-head ``strengths`` (layers x heads), rounded to 6 digits."""
    values = [[round(float(v), 6) for v in row] for row in strengths.detach().cpu().clamp(0.0, 1.0)]
    mean = round(sum(map(sum, values)) / sum(map(len, values)), 6)
    return Calibration(basket_size, tuple(layers), mean, head_strengths=dict(zip(layers, values, strict=True)))


def fit_learned(
    model,
    train_instances: Sequence[Any],
    dev_instances: Sequence[Any],
    *,
    basket_size: int = 64,
    layers: int | float | tuple[int, ...] = 0.5,
    steps: int = 200,
    lr: float = 0.1,
    init_strength: float = 0.5,
    sets_per_batch: int = 4,
    docs_per_set: int | None = 6,
    tau: float = 0.05,
    keep_weight: float = 1.0,
    eval_every: int = 10,
    patience: int = 3,
    batch_size: int = 16,
    progress: Progress | None = None,
    seed: int = 0,
) -> Calibration:
    """Per-layer, per-head strengths fitted by gradient (module docstring); returns the best on dev.

    ``model``: a :class:`~posfair.FairModel` (its pooling known); ``train_instances`` / ``dev_instances``: permuted
    segment sets (:class:`posfair.fairness.documents.Instance`, or anything with ``.documents``, each with
    ``.text``, ``.texts`` and ``.set_id``).  ``basket_size`` / ``layers``: the calibration's (every calibrated layer
    gets one strength per head, starting at ``init_strength``); ``steps`` Adam steps at ``lr`` on ``theta``
    (strength = sigmoid(theta)), each on ``sets_per_batch`` sets (at most ``docs_per_set`` orderings of each);
    ``tau`` / ``keep_weight``: :class:`SigmaObjective`'s; every ``eval_every`` steps the dev objective, stopping after
    ``patience`` evaluations without improvement.  ``batch_size``: texts per forward pass.
    """
    if not 0.0 < init_strength < 1.0:
        raise ValueError(f"init_strength must be in (0, 1) (sigmoid's range); got {init_strength}")
    tm = model.transformer_module
    layer_ids = tm.resolve(Calibration(basket_size, layers)).layers
    H = _heads(model)
    template = _fitted(layer_ids, basket_size, torch.full((len(layer_ids), H), init_strength))
    objective = SigmaObjective(tau, keep_weight)
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        for p, _ in frozen:
            p.requires_grad_(False)
        train, dev = _prepare(model, train_instances, dev_instances, template, docs_per_set=docs_per_set,
                              sets_per_batch=sets_per_batch, objective=objective, batch_size=batch_size, seed=seed)  # fmt: skip
        return _train(model, template, layer_ids, train, dev, objective, steps=steps, lr=lr, eval_every=eval_every,
                      patience=patience, batch_size=batch_size, progress=progress, seed=seed)  # fmt: skip
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        for m, flag in modes:
            m.training = flag


def _train(model, template, layer_ids, train: _Split, dev: _Split, objective, *, steps, lr, eval_every, patience,
           batch_size, progress, seed) -> Calibration:  # fmt: skip
    """The gradient loop of :func:`fit_learned`, with early stopping on ``dev``."""
    tm = model.transformer_module
    base = tm.resolve(template)
    init = torch.tensor([list(v) for _, v in template.head_strengths], dtype=torch.float32)
    theta = torch.logit(init).requires_grad_(True)
    opt = torch.optim.Adam([theta], lr=lr)
    order = random.Random(seed + 1)
    best, best_value, stale = template, _evaluate(model, dev, objective, template, batch_size), 0
    log.info("dev objective: stock 1.0, start %.4f", best_value)
    for step in range(steps):
        i = order.randrange(len(train.batches))
        batch = train.batches[i]
        strengths = torch.sigmoid(theta)
        resolved = replace(base, head_strengths=tuple((layer, strengths[k]) for k, layer in enumerate(layer_ids)))
        with torch.enable_grad(), tm.resolving(template, resolved), calibration_override(template):
            sig, ce = objective.parts(embed(model, batch.docs, batch_size), embed(model, batch.segs, batch_size), batch)
            loss = objective.value(sig, batch.pair_pos, ce, train.ce_stock[i])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress is not None:
            progress(step + 1, steps, float(loss.detach()))
        if (step + 1) % eval_every and step + 1 != steps:
            continue
        current = _fitted(layer_ids, template.basket_size, torch.sigmoid(theta))
        value = _evaluate(model, dev, objective, current, batch_size)
        log.info("step %d: train %.4f, dev %.4f (best %.4f)", step + 1, float(loss.detach()), value, best_value)
        if value < best_value:
            best, best_value, stale = current, value, 0
        else:
            stale += 1
            if stale >= patience:
                break
    return best


def fit_tempscale(
    model,
    train_instances: Sequence[Any],
    dev_instances: Sequence[Any],
    *,
    temperatures: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.9, 1.1, 1.25, 1.5),
    layers: int | float | tuple[int, ...] = 0.5,
    basket_size: int = 1,
    sets_per_batch: int = 4,
    docs_per_set: int | None = 6,
    tau: float = 0.05,
    keep_weight: float = 1.0,
    batch_size: int = 16,
    progress: Progress | None = None,
    seed: int = 0,
) -> Calibration:
    """TempScale: the temperature among ``temperatures`` with the lowest dev objective (module docstring), the basket
    formula off (``strength=0``) in the calibrated ``layers``.  Tuning-free: ``train_instances`` only checks that the
    calibration reaches the training documents (the scale and the choice come from dev).  ``basket_size``: texts whose
    content is shorter are left stock (1: every text is tempered).  A warning is logged when no temperature improves on
    the stock model (objective 1)."""
    if not temperatures:
        raise ValueError("fit_tempscale needs at least one temperature")
    cals = [Calibration(basket_size, layers, 0.0, temperature=float(t)) for t in temperatures]
    objective = SigmaObjective(tau, keep_weight)
    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        _, dev = _prepare(model, train_instances, dev_instances, cals[0], docs_per_set=docs_per_set,
                          sets_per_batch=sets_per_batch, objective=objective, batch_size=batch_size, seed=seed)  # fmt: skip
        values = []
        for k, cal in enumerate(cals):
            values.append(_evaluate(model, dev, objective, cal, batch_size))
            log.info("temperature %g: dev objective %.4f", cal.temperature, values[-1])
            if progress is not None:
                progress(k + 1, len(cals), values[-1])
    finally:
        for m, flag in modes:
            m.training = flag
    best = min(range(len(cals)), key=values.__getitem__)
    if values[best] >= 1.0:
        log.warning(
            "no temperature of %s improves on the stock model's dev objective (best %g: %.4f >= 1)",
            list(temperatures), cals[best].temperature, values[best],
        )  # fmt: skip
    return cals[best]
