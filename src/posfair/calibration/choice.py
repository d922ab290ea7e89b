"""What to encode with: a :class:`~posfair.Calibration`, :data:`STOCK` or :data:`MODEL_DEFAULT`.

Every layer of posfair that takes a calibration (``FairModel.encode``, the encoding layer, the
evaluators, the audit, the tuner, the MTEB wrapper) takes one of these three values and nothing
else; ``None`` and ``False`` are refused with a TypeError that names the two spelled-out values,
so "no calibration given" cannot mean two things in two places.

* :data:`STOCK`: the stock model, even when the model carries a default calibration;
* :data:`MODEL_DEFAULT`: the calibration the model carries (``load_model(calibration=...)``,
  ``set_calibration`` or a saved calibrated folder), which is :data:`STOCK` for a model without one
  and for a plain sentence-transformers model;
* a :class:`~posfair.Calibration`.

:func:`resolve` turns :data:`MODEL_DEFAULT` into one of the other two; :data:`STOCK` has the
``key()`` / ``label()`` / ``describe()`` a :class:`~posfair.Calibration` has, so tables and caches
name it without a special case.
"""

from __future__ import annotations

from typing import Any, Final

from posfair.calibration.params import Calibration

__all__ = [
    "STOCK",
    "MODEL_DEFAULT",
    "Stock",
    "ModelDefault",
    "CalibrationChoice",
    "Resolved",
    "check_choice",
    "resolve",
    "is_stock",
]


class _Named:
    """A named singleton whose truth value is refused (``if choice:`` would hide which one it is)."""

    __slots__ = ()
    _name = ""

    def __new__(cls):
        inst = cls.__dict__.get("_instance")
        if inst is None:
            inst = super().__new__(cls)
            cls._instance = inst
        return inst

    def __repr__(self) -> str:
        return f"posfair.{self._name}"

    def __bool__(self) -> bool:
        raise TypeError(
            f"the truth value of posfair.{self._name} is not defined: compare with `is posfair.{self._name}`"
        )

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):  # the same object after copying between processes (Ray workers)
        return type(self), ()


class Stock(_Named):
    """The type of :data:`STOCK`: the stock model, no calibration."""

    __slots__ = ()
    _name = "STOCK"

    def key(self) -> str:
        """The name caches, trial ids and result files give the stock model."""
        return "stock"

    def label(self) -> str:
        """The name tables give the stock model (the column value beside calibrations' labels)."""
        return "stock"

    def figure_label(self) -> str:
        """The name figures give the stock model."""
        return "stock"

    def describe(self) -> str:
        return "no calibration (the stock model)"


class ModelDefault(_Named):
    """The type of :data:`MODEL_DEFAULT`: whatever calibration the model carries (stock if none)."""

    __slots__ = ()
    _name = "MODEL_DEFAULT"


#: the stock model: no calibration, even when the model carries a default one
STOCK: Final = Stock()
#: the calibration the model carries (``set_calibration``, ``load_model(calibration=...)``, a saved folder); stock if none
MODEL_DEFAULT: Final = ModelDefault()

#: what every ``calibration=`` parameter takes
CalibrationChoice = Calibration | Stock | ModelDefault
#: a choice with :data:`MODEL_DEFAULT` resolved (what a forward pass runs with)
Resolved = Calibration | Stock


def check_choice(value: Any, *, what: str = "calibration", model_default: bool = True) -> CalibrationChoice:
    """``value`` if it is a :class:`~posfair.Calibration`, :data:`STOCK` or (when ``model_default``)
    :data:`MODEL_DEFAULT`; TypeError naming the accepted values otherwise (``None`` and ``False`` included)."""
    if isinstance(value, Calibration) or value is STOCK or (model_default and value is MODEL_DEFAULT):
        return value
    accepted = (
        "a posfair.Calibration, posfair.STOCK or posfair.MODEL_DEFAULT"
        if model_default
        else "a posfair.Calibration or posfair.STOCK"
    )
    hint = ""
    if value is None or value is False:
        hint = " (say posfair.STOCK for the stock model" + (
            ", posfair.MODEL_DEFAULT for the model's default)" if model_default else ")"
        )
    elif value is MODEL_DEFAULT:
        hint = " (MODEL_DEFAULT has no meaning here: there is no model to take a default from)"
    raise TypeError(f"{what} must be {accepted}; got {value!r}{hint}")


def resolve(choice: CalibrationChoice, model_default: Resolved = STOCK) -> Resolved:
    """``choice`` with :data:`MODEL_DEFAULT` replaced by ``model_default`` (the model's own calibration)."""
    choice = check_choice(choice)
    if choice is MODEL_DEFAULT:
        return check_choice(model_default, what="the model's default calibration", model_default=False)
    return choice


def is_stock(choice: Any) -> bool:
    """True for :data:`STOCK` (a resolved choice that calibrates nothing)."""
    return choice is STOCK
