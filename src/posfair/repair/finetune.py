"""Position-balanced fine-tuning (``posfair fit --method finetune``), through the sentence-transformers Trainer.

Each training row is one document of a permuted segment set and its segments in document order (columns
``document``, ``segment_1`` .. ``segment_n``; ``label`` = the set's index).  Every ordering of a set is a row,
so each segment sits at every position equally often.  :class:`PositionBalancedLoss` is
MultipleNegativesRankingLoss with a document's own segments as positives, one at each position (in-batch
negatives: the segments of every other set in the batch; the other documents of the same set hold the same
segments and are masked, not counted as negatives), plus a balance term: the variance over positions of the
document's own-segment cosines σ_p.  The contrastive term keeps every segment findable from its document; the
balance term asks that no position be represented better than another.  The fitted model is a plain
sentence-transformers model: saved, it loads anywhere without posfair.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset
from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from torch import nn
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint

from posfair.fairness.documents import Instance

__all__ = ["FinetuneSettings", "PositionBalancedLoss", "fit_finetune", "training_rows"]

log = logging.getLogger(__name__)

#: progress(step, total steps, the latest training objective)
FitProgress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class FinetuneSettings:
    """The fine-tuning's settings (all recorded with the fit).

    ``steps``: optimiser steps; ``batch_size``: documents per step (each with its n segments);
    ``learning_rate``: AdamW's, with linear warm-up over the first tenth and linear decay;
    ``balance``: the weight of the balance term; ``scale``: the contrastive term's inverse temperature
    (MultipleNegativesRankingLoss' 20); ``freeze_embeddings``: keep the input embedding tables fixed (a
    multilingual vocabulary is most of the weights and few of its rows occur in the training documents);
    ``eval_every``: steps between evaluations of the objective on the dev documents (the best is kept)."""

    steps: int = 150
    batch_size: int = 8
    learning_rate: float = 5e-5
    balance: float = 50.0
    scale: float = 20.0
    trained_layers: float = 1 / 3
    eval_every: int = 50
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class PositionBalancedLoss(nn.Module):
    """MultipleNegativesRankingLoss over each document's own segments plus ``balance`` x the variance of its
    own-segment cosines over positions.  Inputs: the features of ``document, segment_1 .. segment_n``; labels:
    the segment set of each row (rows of one set share their segments, which are then not negatives)."""

    def __init__(self, model, scale: float = 20.0, balance: float = 50.0):
        super().__init__()
        self.model = model
        self.scale = float(scale)
        self.balance = float(balance)

    def forward(self, sentence_features: Sequence[dict[str, torch.Tensor]], labels: torch.Tensor) -> torch.Tensor:
        reps = [F.normalize(self.model(f)["sentence_embedding"], dim=-1) for f in sentence_features]
        contrastive, spread = position_balanced_terms(reps[0], torch.stack(reps[1:], dim=1), labels, self.scale)
        return contrastive + self.balance * spread

    def get_config_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "balance": self.balance}


def position_balanced_terms(
    docs: torch.Tensor, segments: torch.Tensor, sets: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The loss's two terms from unit embeddings: ``docs`` (b x d), ``segments`` (b x n x d, document order),
    ``sets`` (b,) the segment set of each row.  Returns (the contrastive term: mean cross-entropy of each own
    segment against every segment of the other sets in the batch; the balance term: the mean over documents
    of the variance of σ_p over positions)."""
    b, n, d = segments.shape
    flat = segments.reshape(b * n, d)
    sims = docs @ flat.T  # b x bn
    owner = torch.arange(b, device=docs.device).repeat_interleave(n)
    same_set = sets[:, None] == sets[owner][None, :]
    rows = torch.arange(b, device=docs.device)
    contrastive = docs.new_zeros(())
    for p in range(n):
        target = rows * n + p
        masked = same_set.clone()
        masked[rows, target] = False
        logits = (scale * sims).masked_fill(masked, float("-inf"))
        contrastive = contrastive + F.cross_entropy(logits, target)
    sigma = sims[rows[:, None], rows[:, None] * n + torch.arange(n, device=docs.device)[None, :]]
    spread = sigma.var(dim=1, unbiased=False).mean()
    return contrastive / n, spread


def training_rows(instances: Sequence[Instance]) -> dict[str, list]:
    """The Trainer's columns from permuted segment sets: ``document``, ``segment_1`` .. ``segment_n`` (document
    order) and ``label`` (the set's index, unique across ``instances``).  All instances must share one n."""
    ns = {inst.n for inst in instances}
    if len(ns) != 1:
        raise ValueError(f"fine-tuning rows need one segment count; got n = {sorted(ns)}")
    n = ns.pop()
    out: dict[str, list] = {"document": [], **{f"segment_{p}": [] for p in range(1, n + 1)}, "label": []}
    set_index: dict[str, int] = {}
    for inst in instances:
        for d in inst.documents:
            out["document"].append(d.text)
            for p, text in enumerate(d.texts, start=1):
                out[f"segment_{p}"].append(text)
            out["label"].append(set_index.setdefault(f"{inst.key}/{d.set_id}", len(set_index)))
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
    :class:`PositionBalancedLoss` through ``SentenceTransformerTrainer``; the dev documents' loss is evaluated every
    ``settings.eval_every`` steps and the best state is kept (early stopping on dev).  Checkpoints go to
    ``work_dir`` (a rerun with the same ``work_dir`` resumes from the last one).  Returns the model."""
    s = settings or FinetuneSettings()
    train_ds = Dataset.from_dict(training_rows(train)).shuffle(seed=s.seed)
    dev_ds = Dataset.from_dict(training_rows(dev))
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

    trainer = SentenceTransformerTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=dev_ds,
        loss=PositionBalancedLoss(model, scale=s.scale, balance=s.balance),
        callbacks=[_Progress()],
    )
    trainer.remove_callback(PrinterCallback)  # the log dicts it prints: progress reaches ``progress`` instead
    trainer.train(resume_from_checkpoint=_last_checkpoint(work_dir))
    for p in model.parameters():
        p.requires_grad_(True)
    return model


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
