"""Position-balanced fine-tuning (``posfair fit --method finetune``), through the sentence-transformers Trainer.

Each training row is one document of a permuted segment set and its segments in document order (columns
``document``, ``segment_1`` .. ``segment_n``); every ordering of a set is a row, so each segment sits at every
position equally often.  The row's label holds what the stock model says, computed once before the fit
(:func:`stock_targets`): the *set's target*, the mean of the stock embeddings of every ordering of the set
(unit length), and the stock embedding of each segment.

:class:`OrderInvariantLoss` distils the document toward its set's target.  That target is order-free by
construction: it is the same vector whichever ordering is embedded, and every segment entered it at every
position equally often, so a model that reaches it gives each position the same mean cosine (the position
coefficients β_p are zero) while keeping what the stock model knows of the content.  A second term holds each
standalone segment at its stock embedding (the queries of a search stay where the index expects them), and an
optional third is MultipleNegativesRankingLoss over the document's own segments (in-batch negatives: the
segments of every other set; the other orderings of the same set hold the same segments and are masked).
Dropout is off while the loss runs: the targets are exact.  The fitted model is a plain sentence-transformers
model: saved, it loads anywhere without posfair.

With a LoRA adapter (:class:`LoraSettings`, ``posfair fit --adapter lora``) only the adapter's low-rank weights
are trained (every weight of the model stays the stock one) and the saved folder is an adapter folder of a few MB:
the sentence-transformers modules and PEFT's ``adapter_config.json`` / ``adapter_model.safetensors``, whose config
names the base model.  ``posfair.load_model(DIR)`` loads the base and the adapter; so does peft
(``PeftModel.from_pretrained(SentenceTransformer(BASE)[0].auto_model, DIR)``) and, on a transformers whose PEFT
integration takes the installed peft, sentence-transformers' ``SentenceTransformer(BASE).load_adapter(DIR)``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from torch import nn
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint

from posfair.encoding.passes import encode_texts, l2_normalize
from posfair.fairness.documents import Instance
from posfair.model.fair_model import add_lora_adapter, set_adapter_weights
from posfair.runtime.errors import PosfairInputError, install_hint

try:  # the adapter extra (posfair fit --adapter lora)
    from peft import LoraConfig
except ImportError:  # pragma: no cover - without the extra
    LoraConfig = None

__all__ = [
    "FinetuneSettings",
    "LoraSettings",
    "add_lora",
    "attention_projections",
    "check_lora_targets",
    "OrderInvariantLoss",
    "StockTargets",
    "fit_finetune",
    "order_invariance_terms",
    "stock_targets",
    "training_rows",
]

log = logging.getLogger(__name__)

#: progress(step, total steps, the latest training objective)
FitProgress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class FinetuneSettings:
    """The fine-tuning's settings (all recorded with the fit).

    ``steps``: optimiser steps; ``batch_size``: documents per step (each with its n segments);
    ``learning_rate``: AdamW's, with linear warm-up over the first tenth and linear decay;
    ``anchor``: the weight of holding each standalone segment at its stock embedding; ``contrastive``: the
    weight of the in-batch ranking term (0: off) and ``scale`` its inverse temperature (MultipleNegativesRankingLoss'
    20); ``trained_layers``: the share of the transformer's layers trained, the last ones (the input embedding
    tables stay fixed: a multilingual vocabulary is most of the weights and few of its rows occur in the
    training documents); ``eval_every``: steps between evaluations of the objective on the dev documents (the
    best is kept)."""

    steps: int = 200
    batch_size: int = 8
    learning_rate: float = 2e-4
    anchor: float = 1.0
    contrastive: float = 0.0
    scale: float = 20.0
    trained_layers: float = 1.0
    eval_every: int = 50
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter's settings (recorded with the fit): ``rank`` (r), ``alpha`` (the update is scaled by
    alpha / r; None: twice the rank), ``targets`` (the names of the linear modules adapted, as peft matches them: a module's name or the
    end of it after a dot; empty: the model's attention projections, :func:`attention_projections`) and the
    ``learning_rate`` of the adapter's fine-tuning (in place of :class:`FinetuneSettings`' own).  No dropout: the
    loss runs with dropout off (:class:`OrderInvariantLoss`)."""

    rank: int = 16
    alpha: float | None = None
    targets: tuple[str, ...] = ()
    learning_rate: float = 1e-3

    def __post_init__(self) -> None:
        if self.alpha is None:
            object.__setattr__(self, "alpha", 2.0 * self.rank)

    def label(self) -> str:
        return f"lora r={self.rank}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "targets": list(self.targets)}


def _linear_names(model) -> list[str]:
    auto = model.transformer_module.auto_model
    return [name for name, mod in auto.named_modules() if isinstance(mod, nn.Linear) and name]


def attention_projections(model) -> tuple[str, ...]:
    """The attention projections of ``model``'s transformer, as LoRA targets: each linear module inside an attention
    block, named from that block on (BERT and XLM-R: ``attention.self.query``, ``.key``, ``.value`` and
    ``attention.output.dense``; decoders: ``self_attn.q_proj`` ...), in the model's order."""
    out: list[str] = []
    for name in _linear_names(model):
        parts = name.split(".")
        at = next((i for i, p in enumerate(parts) if "attention" in p.lower() or "attn" in p.lower()), None)
        if at is not None:
            suffix = ".".join(parts[at:])
            if suffix not in out:
                out.append(suffix)
    if not out:
        raise PosfairInputError(
            "--adapter lora: no attention projection found by name in this model; name the modules with --lora-targets"
        )
    return tuple(out)


def check_lora_targets(model, targets: Sequence[str]) -> tuple[str, ...]:
    """``targets`` (empty: :func:`attention_projections`), each the name of at least one linear module of ``model``
    (as peft matches it); refused with :class:`PosfairInputError` naming ``--lora-targets`` (and ``--adapter lora``
    without peft installed)."""
    if LoraConfig is None:
        raise PosfairInputError(f"--adapter lora: needs peft, the adapter extra: {install_hint('adapter')}")
    if not targets:
        return attention_projections(model)
    names = _linear_names(model)
    for t in targets:
        if not any(n == t or n.endswith("." + t) for n in names):
            raise PosfairInputError(
                f"--lora-targets {','.join(targets)}: {t!r} names no linear module of the model (its attention "
                f"projections: {', '.join(attention_projections(model))})"
            )
    return tuple(targets)


def add_lora(model, lora: LoraSettings, base: str):
    """Put an untrained LoRA adapter of ``lora`` into ``model`` (in place; its saved folder names ``base`` as its base
    model).  Returns the peft config."""
    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=0.0, target_modules=list(lora.targets),
        base_model_name_or_path=base,
    )  # fmt: skip
    add_lora_adapter(model, config)
    return config


class OrderInvariantLoss(nn.Module):
    """``distil + anchor * hold + contrastive * rank`` (:func:`order_invariance_terms`).  Inputs: the features of
    ``document, segment_1 .. segment_n``; labels: per row the set's target and the n segments' stock embeddings,
    concatenated ((n + 1) x dim numbers, :func:`training_rows`)."""

    def __init__(self, model, anchor: float = 1.0, contrastive: float = 0.0, scale: float = 20.0):
        super().__init__()
        self.model = model
        self.anchor = float(anchor)
        self.contrastive = float(contrastive)
        self.scale = float(scale)

    def forward(self, sentence_features: Sequence[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        self.model.eval()  # the Trainer switches dropout on before each step; the targets are exact
        reps = [F.normalize(self.model(f)["sentence_embedding"], dim=-1) for f in sentence_features]
        n = len(reps) - 1
        targets = labels.to(reps[0].dtype).reshape(len(reps[0]), n + 1, -1)
        distil, hold, rank = order_invariance_terms(
            reps[0], torch.stack(reps[1:], dim=1), targets[:, 0], targets[:, 1:], self.scale, self.contrastive > 0
        )
        return distil + self.anchor * hold + self.contrastive * rank

    def get_config_dict(self) -> dict[str, float]:
        return {"anchor": self.anchor, "contrastive": self.contrastive, "scale": self.scale}


def order_invariance_terms(
    docs: torch.Tensor,
    segments: torch.Tensor,
    targets: torch.Tensor,
    segment_targets: torch.Tensor,
    scale: float = 20.0,
    with_rank: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The loss's three terms from unit embeddings: ``docs`` (b x d), ``segments`` (b x n x d, document order),
    ``targets`` (b x d, each row's set target), ``segment_targets`` (b x n x d, the segments' stock embeddings).

    Returns (*distil*: the mean of 1 - cos(document, its set's target); *hold*: the mean of 1 - cos(segment, its
    stock embedding); *rank*: the mean cross-entropy of each own segment against the segments of every other set
    in the batch at inverse temperature ``scale``; rows of one set, which share the target, do not count as each
    other's negatives; zero when ``with_rank`` is false)."""
    b, n, d = segments.shape
    distil = (1.0 - (docs * targets).sum(-1)).mean()
    hold = (1.0 - (segments * segment_targets).sum(-1)).mean()
    if not with_rank:
        return distil, hold, docs.new_zeros(())
    sets = torch.unique(targets, dim=0, return_inverse=True)[1]
    flat = segments.reshape(b * n, d)
    sims = docs @ flat.T  # b x bn
    owner = torch.arange(b, device=docs.device).repeat_interleave(n)
    same_set = sets[:, None] == sets[owner][None, :]
    rows = torch.arange(b, device=docs.device)
    rank = docs.new_zeros(())
    for p in range(n):
        target = rows * n + p
        masked = same_set.clone()
        masked[rows, target] = False
        rank = rank + F.cross_entropy((scale * sims).masked_fill(masked, float("-inf")), target)
    return distil, hold, rank / n


@dataclass(frozen=True)
class StockTargets:
    """What the stock model says of the fit's documents: ``sets``: set id -> the set's target, the unit-length
    mean of the embeddings of all its documents (every ordering); ``segments``: segment text -> its unit
    embedding."""

    sets: dict[str, np.ndarray]
    segments: dict[str, np.ndarray]


def stock_targets(model, instances: Sequence[Instance], batch_size: int = 16) -> StockTargets:
    """:class:`StockTargets` of ``instances``, encoded by ``model`` as it is (call before the fit)."""
    sets: dict[str, np.ndarray] = {}
    segments: dict[str, np.ndarray] = {}
    for inst in instances:
        docs = inst.documents
        emb = l2_normalize(encode_texts(model, [d.text for d in docs], batch_size=batch_size).astype(np.float64))
        by_set: dict[str, list[np.ndarray]] = {}
        for d, v in zip(docs, np.asarray(emb, np.float64), strict=True):
            by_set.setdefault(d.set_id, []).append(v)
        for set_id, vecs in by_set.items():
            mean = np.mean(vecs, axis=0)
            sets[set_id] = mean / np.linalg.norm(mean)
        texts = sorted({t for d in docs for t in d.texts} - segments.keys())
        if texts:
            seg = l2_normalize(encode_texts(model, texts, batch_size=batch_size).astype(np.float64))
            segments.update(zip(texts, np.asarray(seg, np.float64), strict=True))
    return StockTargets(sets, segments)


def training_rows(instances: Sequence[Instance], targets: StockTargets) -> dict[str, list]:
    """The Trainer's columns from permuted segment sets: ``document``, ``segment_1`` .. ``segment_n`` (document
    order) and ``label`` (the set's target, then each segment's stock embedding, from :func:`stock_targets`).
    All instances must share one n."""
    ns = {inst.n for inst in instances}
    if len(ns) != 1:
        raise ValueError(f"fine-tuning rows need one segment count; got n = {sorted(ns)}")
    n = ns.pop()
    out: dict[str, list] = {"document": [], **{f"segment_{p}": [] for p in range(1, n + 1)}, "label": []}
    for inst in instances:
        for d in inst.documents:
            out["document"].append(d.text)
            for p, text in enumerate(d.texts, start=1):
                out[f"segment_{p}"].append(text)
            vecs = [targets.sets[d.set_id], *(targets.segments[t] for t in d.texts)]
            out["label"].append(np.concatenate(vecs).astype(np.float32).tolist())
    return out


def fit_finetune(
    model,
    train: Sequence[Instance],
    dev: Sequence[Instance],
    work_dir: str,
    settings: FinetuneSettings | None = None,
    *,
    progress: FitProgress | None = None,
):
    """Fine-tune ``model`` (a sentence-transformers model, in place) on ``train``'s documents with
    :class:`OrderInvariantLoss` through ``SentenceTransformerTrainer``, toward targets from ``model`` as it is at
    the start; the dev documents' loss is evaluated every ``settings.eval_every`` steps and the best state is
    kept (early stopping on dev).  Checkpoints go to ``work_dir`` (a rerun with the same ``work_dir`` resumes
    from the last one).  A model with a LoRA adapter (:func:`add_lora`) trains the adapter alone.  Returns the
    model."""
    s = settings or FinetuneSettings()
    train = _sets_used(train, s.steps * s.batch_size, s.seed)
    targets = stock_targets(model, [*train, *dev])
    train_ds = Dataset.from_dict(training_rows(train, targets)).shuffle(seed=s.seed)
    dev_ds = Dataset.from_dict(training_rows(dev, targets))
    adapter = _has_adapter(model)
    if not adapter:  # an adapter trains its own weights alone (add_lora)
        _freeze_below(model, s.trained_layers)
    args = SentenceTransformerTrainingArguments(
        output_dir=work_dir,
        per_device_train_batch_size=s.batch_size,
        per_device_eval_batch_size=s.batch_size,
        max_steps=s.steps,
        learning_rate=s.learning_rate,
        warmup_steps=max(1, s.steps // 10),
        eval_strategy="steps",
        eval_steps=s.eval_every,
        save_strategy="steps",
        save_steps=s.eval_every,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        greater_is_better=False,
        logging_steps=max(1, min(10, s.eval_every)),
        report_to=[],
        seed=s.seed,
        data_seed=s.seed,
        dataloader_pin_memory=False,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )

    class _Progress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if progress is not None and logs and "loss" in logs:
                progress(int(state.global_step), int(state.max_steps), float(logs["loss"]))

    trainer = (_AdapterTrainer if adapter else SentenceTransformerTrainer)(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=dev_ds,
        loss=OrderInvariantLoss(model, anchor=s.anchor, contrastive=s.contrastive, scale=s.scale),
        callbacks=[_Progress()],
    )
    trainer.remove_callback(PrinterCallback)  # the log dicts it prints: progress reaches ``progress`` instead
    trainer.train(resume_from_checkpoint=_last_checkpoint(work_dir))
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _has_adapter(model) -> bool:
    return any("lora_" in name for name, _ in model.named_parameters())


class _AdapterTrainer(SentenceTransformerTrainer):
    """The Trainer of a model with a LoRA adapter: its checkpoints hold the adapter alone (the model's save writes an
    adapter folder), so resuming and keeping the best state on dev load the adapter's weights back into the model."""

    def _load_from_checkpoint(self, checkpoint_path: str, *args, **kwargs) -> None:
        set_adapter_weights(getattr(self.model, "_orig_mod", self.model), checkpoint_path)


def _sets_used(instances: Sequence[Instance], rows: int, seed: int) -> list[Instance]:
    """``instances`` cut to the segment sets of ``rows`` documents drawn at random (seeded), every ordering of each
    kept: a short fit (``steps x batch_size`` below the number of documents) then encodes targets only for the
    sets it can reach.  All of ``instances`` when ``rows`` covers them."""
    docs = [(i, d.set_id) for i, inst in enumerate(instances) for d in inst.documents]
    if rows >= len(docs):
        return list(instances)
    order = np.random.default_rng(seed).permutation(len(docs))[:rows]
    keep = {docs[k] for k in order}
    out = []
    for i, inst in enumerate(instances):
        sets = [x for x in inst.sets if (i, x.set_id) in keep]
        if sets:
            documents = [d for d in inst.documents if (i, d.set_id) in keep]
            out.append(dataclasses.replace(inst, sets=sets, documents=documents))
    return out


def _freeze_below(model, share: float) -> None:
    """Gradients only for the last ``share`` of the transformer's layers (at least one) and what follows them."""
    first = next(iter(model._modules.values()))
    auto = first.auto_model
    count = int(auto.config.num_hidden_layers)
    lowest = count - max(1, round(share * count))
    number = re.compile(r"(?:^|\.)layers?\.(\d+)\.")
    for name, p in auto.named_parameters():
        m = number.search(name)
        p.requires_grad_(m is not None and int(m.group(1)) >= lowest)


def _last_checkpoint(work_dir: str) -> str | None:
    return get_last_checkpoint(work_dir) if os.path.isdir(work_dir) else None
