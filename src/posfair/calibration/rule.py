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
prior).  And strength 0 returns the original row.  :func:`row_changes` is that predicate, on the one value the
kernels read (:class:`~posfair.calibration.resolved.BasketSettings`); :mod:`posfair.calibration.coverage` builds
the encode-time warning and every table's calibrated share on it, so what posfair reports is what the engine did.

Both work on numpy arrays and torch tensors alike (comparison operators only).
"""

from __future__ import annotations

from typing import Any

from posfair.calibration.resolved import BasketSettings

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


def one_basket_changes(settings: BasketSettings) -> bool:
    """Whether the formula changes a row whose content is exactly one basket: an isolated key is
    given a new share, or a self-attention share below 1 takes mass from the row's own key."""
    s = _concrete(settings)
    reweights = (s.isolate_bos and s.bos_weight != "original") or (s.isolate_eos and s.eos_weight != "original")
    return bool(reweights or (s.self_share is not None and float(s.self_share) != 1.0))


def row_changes(n_content: Any, settings: BasketSettings) -> Any:
    """Whether calibration changes the rows of a text with ``n_content`` content keys (elementwise):
    the formula runs and either the content is more than one basket (:func:`basket_count`) or the
    one basket's row is changed by :func:`one_basket_changes`; never at strength 0.

    ``settings``: the kernels' :class:`~posfair.calibration.resolved.BasketSettings` (a TypeError for anything
    else; :func:`posfair.calibration.coverage.text_settings` makes one of a whole calibration)."""
    s = _concrete(settings)
    B = int(s.basket_size)
    runs = engine_calibrates(n_content, B)
    if strength_zero(s):
        return runs & False
    if tempers(s):
        return runs  # TempScale changes every row the formula runs on
    return runs & ((basket_count(n_content, B, s.trailing) > 1) | one_basket_changes(s))


def tempers(settings: BasketSettings) -> bool:
    """Whether TempScale's temperature (other than 1) changes the rows the formula runs on."""
    T = _concrete(settings).temperature
    return T is not None and float(T) != 1.0


def strength_zero(settings: BasketSettings) -> bool:
    """Whether the setting returns every row as it was: strength 0 (every per-head strength 0, when it has them), no
    temperature other than 1."""
    if tempers(settings):
        return False
    if settings.head_strength is not None:  # they replace the layer's strength (BasketSettings.for_heads)
        return not any(float(v) for v in settings.head_strength)
    return float(settings.strength) == 0.0


def _concrete(settings: BasketSettings) -> BasketSettings:
    """``settings``, refused with a TypeError when it is not a :class:`BasketSettings` or the pooling has yet to
    decide which keys it isolates."""
    if not isinstance(settings, BasketSettings):
        raise TypeError(f"the rule takes a BasketSettings (one layer's setting); got {type(settings).__name__}")
    if not (isinstance(settings.isolate_bos, bool) and isinstance(settings.isolate_eos, bool)):
        raise TypeError(
            "the rule needs concrete settings: resolve the calibration for the model's pooling first "
            f"(isolate_bos={settings.isolate_bos!r}, isolate_eos={settings.isolate_eos!r})"
        )
    return settings
