"""Which texts the basket formula changes: the one predicate of the engine and of every count.

A text's attention rows go through the basket formula when its content (valid keys minus the
isolated BOS / EOS keys) fills at least one basket, ``C >= basket_size`` (the authors' rule:
shorter texts are encoded uncalibrated).  :func:`engine_calibrates` is that rule; every basket
kernel (:mod:`posfair.calibration.baskets`, :mod:`posfair.calibration.fused`) calls it.

Among the texts the formula runs on, it leaves a row exactly unchanged only when the content is
*one* basket (:func:`basket_count` is 1: ``C == basket_size``, or with the ``"merge"`` trailing
policy any ``C < 2 * basket_size``, the short trailing basket joining the first; rescaling the
one basket to the mass it already has multiplies by 1) and nothing else moves mass: no isolated key is given a new share (every isolated key
``"original"``), and no self-attention share below 1 takes mass from the row's own key.
The positional prior does not matter then (one basket gets the whole content mass whatever its
prior).  And strength 0 returns the original row.  :func:`row_changes` is that predicate;
:mod:`posfair.calibration.coverage` builds the encode-time warning and every table's calibrated
share on it, so what posfair reports is what the engine did.

Both work on numpy arrays and torch tensors alike (comparison operators only).
"""

from __future__ import annotations

from typing import Any

__all__ = ["basket_count", "engine_calibrates", "one_basket_changes", "row_changes"]


def engine_calibrates(n_content: Any, basket_size: int) -> Any:
    """Whether the basket formula runs on a text with ``n_content`` content keys (elementwise)."""
    return n_content >= int(basket_size)


def basket_count(n_content: Any, basket_size: int, trailing: str = "basket") -> Any:
    """The number of content baskets of a text with ``n_content >= basket_size`` content keys (elementwise).

    ``"basket"`` and ``"weighted"``: ``ceil(C / B)`` (a trailing basket shorter than B is a basket of its
    own; ``"weighted"`` only changes the masses); ``"merge"``: ``floor(C / B)`` (a trailing basket
    shorter than B joins the one before it).  At least 1 for any ``C`` (texts with ``C < B`` are not
    calibrated, :func:`engine_calibrates`).
    """
    B = int(basket_size)
    if trailing == "merge":
        n = n_content // B
    elif trailing in ("basket", "weighted"):
        n = (n_content + B - 1) // B
    else:
        raise ValueError(f"trailing must be 'basket', 'merge' or 'weighted'; got {trailing!r}")
    return n + (n < 1)  # max(n, 1), elementwise on ints, numpy arrays and torch tensors


def one_basket_changes(
    *, isolate_bos: bool, isolate_eos: bool, bos_weight: Any, eos_weight: Any, self_share: float | None
) -> bool:
    """Whether the formula changes a row whose content is exactly one basket: an isolated key is
    given a new share, or a self-attention share below 1 takes mass from the row's own key."""
    reweights = (isolate_bos and bos_weight != "original") or (isolate_eos and eos_weight != "original")
    return bool(reweights or (self_share is not None and float(self_share) != 1.0))


def row_changes(
    n_content: Any,
    *,
    basket_size: int,
    strength: float,
    isolate_bos: bool,
    isolate_eos: bool,
    bos_weight: Any,
    eos_weight: Any,
    self_share: float | None = None,
    trailing: str = "basket",
) -> Any:
    """Whether calibration changes the rows of a text with ``n_content`` content keys (elementwise):
    the formula runs and either the content is more than one basket (:func:`basket_count`) or the
    one basket's row is changed by :func:`one_basket_changes`; never at strength 0."""
    B = int(basket_size)
    runs = engine_calibrates(n_content, B)
    if float(strength) == 0.0:
        return runs & False
    one = one_basket_changes(
        isolate_bos=isolate_bos,
        isolate_eos=isolate_eos,
        bos_weight=bos_weight,
        eos_weight=eos_weight,
        self_share=self_share,
    )
    return runs & ((basket_count(n_content, B, trailing) > 1) | one)
