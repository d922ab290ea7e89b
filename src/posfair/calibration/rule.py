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

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posfair.calibration.params import BasketSettings, Calibration, ResolvedCalibration

    Concrete = BasketSettings | ResolvedCalibration | Calibration

__all__ = ["basket_count", "engine_calibrates", "one_basket_changes", "row_changes", "strength_zero", "tempers"]


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


def one_basket_changes(settings: Concrete) -> bool:
    """Whether the formula changes a row whose content is exactly one basket: an isolated key is
    given a new share, or a self-attention share below 1 takes mass from the row's own key."""
    s = _concrete(settings)
    reweights = (s.isolate_bos and s.bos_weight != "original") or (s.isolate_eos and s.eos_weight != "original")
    return bool(reweights or (s.self_share is not None and float(s.self_share) != 1.0))


def row_changes(n_content: Any, settings: Concrete) -> Any:
    """Whether calibration changes the rows of a text with ``n_content`` content keys (elementwise):
    the formula runs and either the content is more than one basket (:func:`basket_count`) or the
    one basket's row is changed by :func:`one_basket_changes`; never at strength 0.

    ``settings``: a concrete setting -- the kernels' :class:`~posfair.calibration.params.BasketSettings`, a
    :class:`~posfair.calibration.params.ResolvedCalibration`, or a :class:`~posfair.Calibration` whose pooling
    is resolved (:meth:`~posfair.Calibration.pooled`); they name their fields alike."""
    s = _concrete(settings)
    B = int(s.basket_size)
    runs = engine_calibrates(n_content, B)
    if strength_zero(s):
        return runs & False
    if tempers(s):
        return runs  # TempScale changes every row the formula runs on
    return runs & ((basket_count(n_content, B, s.trailing) > 1) | one_basket_changes(s))


def tempers(settings: Concrete) -> bool:
    """Whether TempScale's temperature (other than 1) changes the rows the formula runs on."""
    T = getattr(settings, "temperature", None)
    return T is not None and float(T) != 1.0


def strength_zero(settings: Concrete) -> bool:
    """Whether the setting returns every row as it was: strength 0, every per-head strength 0, no temperature
    other than 1."""
    if tempers(settings) or float(settings.strength) != 0.0:
        return False
    per_layer = getattr(settings, "head_strengths", None) or ()  # Calibration / ResolvedCalibration
    values = [float(v) for _, layer in per_layer for v in layer]
    one = getattr(settings, "head_strength", None)  # BasketSettings
    if one is not None:
        values += [float(v) for v in one]
    return not any(values)


def _concrete(settings: Concrete) -> Concrete:
    """``settings``, refused with a TypeError when the pooling has yet to decide which keys it isolates."""
    if not (isinstance(settings.isolate_bos, bool) and isinstance(settings.isolate_eos, bool)):
        raise TypeError(
            "the rule needs concrete settings: resolve the calibration for the model's pooling first "
            f"(isolate_bos={settings.isolate_bos!r}, isolate_eos={settings.isolate_eos!r})"
        )
    return settings
