"""What an embedding job runs with: :class:`EmbedSpec`, everything a worker needs to rebuild the encoder."""

from __future__ import annotations

import dataclasses
from typing import Any

from posfair.calibration import STOCK, Calibration
from posfair.calibration.choice import Stock
from posfair.encoding.batching import Batching
from posfair.model import FairModel, load_model

__all__ = ["EmbedSpec"]


@dataclasses.dataclass(frozen=True)
class EmbedSpec:
    """Everything a worker needs to rebuild the encoder and batch a shard (JSON-serialisable).

    ``batching="length"`` sorts a shard by token length and cuts batches of at most ``max_batch_tokens`` padded
    tokens (``--max-batch-tokens``, ``embed``'s and ``serve``'s one name for it) and ``batch_size`` texts;
    ``batching="fixed"`` hands each shard to ``model.encode(batch_size=batch_size)`` unchanged, which is exactly
    what :func:`~posfair.encoding.encode_cached` does with one chunk (bit-identical vectors when shards equal its
    chunks).
    """

    model: str | None = None
    calibration: dict | None = None
    prompt: str | None = None
    pooling: str | None = None
    padding_side: str | None = None
    max_seq_length: int | None = None
    trust_remote_code: bool = False
    device: str | None = None
    batching: Batching = "length"
    batch_size: int = 32
    max_batch_tokens: int = 16384

    def __post_init__(self) -> None:
        if self.batching not in ("length", "fixed"):
            raise ValueError(f"batching must be 'length' or 'fixed'; got {self.batching!r}")
        if self.batch_size < 1 or self.max_batch_tokens < 1:
            raise ValueError(
                f"batch_size and max_batch_tokens must be >= 1; got {self.batch_size}, {self.max_batch_tokens}"
            )

    @property
    def calibration_obj(self) -> Calibration | Stock:
        """The calibration the shards are encoded with: a Calibration, or STOCK (``calibration`` None)."""
        return Calibration.from_dict(self.calibration) if self.calibration else STOCK

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmbedSpec:
        return cls(**d)

    def load_model(self, device: str | None = None) -> FairModel:
        """Load the encoder (on ``device``, default ``self.device``) and validate the calibration on it."""
        model = load_model(
            None if self.model in (None, "", "bundled") else self.model,
            device=device or self.device,
            trust_remote_code=self.trust_remote_code,
            pooling=self.pooling,
            padding_side=self.padding_side,
            max_seq_length=self.max_seq_length,
        )
        model.eval()
        cal = self.calibration_obj
        if cal is not STOCK:
            model.transformer_module.resolve(cal)
        return model
