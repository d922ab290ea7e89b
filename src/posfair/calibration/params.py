"""The calibration parameters object.

``Calibration`` is immutable and validated on construction.  Fields left as
:data:`POOLING_DECIDES` are resolved against a concrete model (its pooling and its number of
layers) by :meth:`Calibration.resolve`, which returns a :class:`ResolvedCalibration`
holding only concrete values; :meth:`ResolvedCalibration.baskets` turns that into the one value the
basket formula takes in one layer (:class:`BasketSettings`).  Definitions: ``docs/definitions.md``, section 1.

Inside :class:`Calibration` ``None`` means one thing: *off* (no positional prior, no self-attention
share).  The settings a model's pooling decides (``isolate_bos``, ``isolate_eos``, ``queries``) hold
:data:`POOLING_DECIDES` until resolved; the constructor still takes ``None`` for them (and stores
:data:`POOLING_DECIDES`), and :meth:`Calibration.to_dict` writes ``None``, so keys are unchanged.

The string forms -- :meth:`Calibration.label` (short, for tables), :meth:`Calibration.describe` (in
words), :meth:`Calibration.spec` (the command-line form, which :meth:`Calibration.parse` reads back
exactly, as it reads a label back) -- are all written from one table of the settings beyond ``B,layers,alpha``
(:data:`posfair.calibration.spelling._FORMS`); :meth:`Calibration.key` is a digest of :meth:`Calibration.to_dict`.

The parts live by job, and every name is also importable from here: the values a setting takes and
:data:`POOLING_DECIDES` in :mod:`posfair.calibration.setting_values`, :class:`PositionalPrior` and :func:`load_prior`
in :mod:`posfair.calibration.positional_prior`, the string forms' table and :func:`parse_layers` in
:mod:`posfair.calibration.spelling`, :class:`ResolvedCalibration`, :class:`BasketSettings` and
:func:`scheduled_strength` in :mod:`posfair.calibration.resolved`.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from numbers import Integral, Real
from typing import Any, Literal

from posfair.calibration.positional_prior import PositionalPrior, load_prior
from posfair.calibration.resolved import BasketSettings, ResolvedCalibration, scheduled_strength
from posfair.calibration.setting_values import (
    POOLING_DECIDES,
    POOLINGS,
    SCHEDULES,
    TRAILING,
    VARIANT_PARTS,
    VARIANTS,
    Pooling,
    PoolingDecides,
    Schedule,
    Share,
    Trailing,
)
from posfair.calibration.spelling import (
    _FORM_BY_FIELD,
    _FORM_BY_NAME,
    _FORMS,
    _KNOWN_SETTINGS,
    _SPEC_ORDER,
    _SPECIAL_FIELDS,
    _Form,
    _layers_text,
    _number,
    _read_share,
    did_you_mean,
    is_label,
    layers_label,
    parse_layers,
    read_label,
)

__all__ = [
    "POOLINGS",
    "POOLING_DECIDES",
    "SCHEDULES",
    "TRAILING",
    "VARIANTS",
    "VARIANT_PARTS",
    "BasketSettings",
    "Calibration",
    "Pooling",
    "PoolingDecides",
    "PositionalPrior",
    "ResolvedCalibration",
    "Schedule",
    "Share",
    "Trailing",
    "load_prior",
    "parse_layers",
    "scheduled_strength",
]


def _check_head_strengths(value: Any) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """``head_strengths`` as stored: ``((layer, (s_head0, s_head1, ...)), ...)`` sorted by layer, every strength a
    float in [0, 1]; given as a mapping (JSON's string keys are taken) or as those pairs."""
    items = value.items() if isinstance(value, Mapping) else value
    out: dict[int, tuple[float, ...]] = {}
    for pair in items:
        layer, values = pair
        try:
            i = int(layer)
        except (TypeError, ValueError):
            raise ValueError(f"head_strengths: a layer must be a 0-based index; got {layer!r}") from None
        if isinstance(layer, bool) or i < 0 or i in out or (isinstance(layer, Real) and float(layer) != i):
            raise ValueError(f"head_strengths: layer {layer!r} is not a new 0-based index")
        strengths = tuple(values) if isinstance(values, Sequence) and not isinstance(values, str) else None
        if not strengths:
            raise ValueError(f"head_strengths[{i}] must be a non-empty sequence of strengths; got {values!r}")
        for v in strengths:
            if isinstance(v, bool) or not isinstance(v, Real) or not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"head_strengths[{i}]: every strength must be a number in [0, 1]; got {v!r}")
        out[i] = tuple(float(v) for v in strengths)
    if not out:
        raise ValueError("head_strengths must name at least one layer (None: off)")
    return tuple(sorted(out.items()))


def _check_layers(layers):
    """``layers`` checked and normalised: an int >= 1 (the last layers), a float in (0, 1] (a fraction of them) or
    0-based layer indices (a sorted tuple)."""
    if isinstance(layers, bool):
        raise ValueError(
            f"layers must be an int >= 1, a float in (0, 1] or a sequence of layer indices; got {layers!r}"
        )
    if isinstance(layers, Integral):
        if layers < 1:
            raise ValueError(f"layers as an int is the number of last layers and must be >= 1; got {layers}")
        layers = int(layers)
    elif isinstance(layers, Real):
        if not 0.0 < float(layers) <= 1.0:
            raise ValueError(f"layers as a float is a fraction of the layers and must be in (0, 1]; got {layers}")
        layers = float(layers)
    elif isinstance(layers, Sequence) and not isinstance(layers, str):
        idx = list(layers)
        if not idx:
            raise ValueError("layers as a sequence of layer indices must not be empty")
        for i in idx:
            if isinstance(i, bool) or not isinstance(i, Integral) or i < 0:
                raise ValueError(f"layers must contain 0-based layer indices (ints >= 0); got {i!r}")
        if len(set(idx)) != len(idx):
            raise ValueError(f"layers contains duplicate indices: {idx}")
        layers = tuple(sorted(int(i) for i in idx))
    else:
        raise ValueError(
            f"layers must be an int >= 1, a float in (0, 1] or a sequence of layer indices; got {layers!r}"
        )
    return layers


def _check_share(name: str, value: Any) -> Share:
    if isinstance(value, str):
        if value not in ("equal", "original"):
            raise ValueError(f"{name} must be 'equal', 'original' or a float in [0, 1); got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be 'equal', 'original' or a float in [0, 1); got {value!r}")
    value = float(value)
    if not (0.0 <= value < 1.0) or math.isnan(value):
        raise ValueError(f"{name} must be in [0, 1) when given as a float; got {value}")
    return value


@dataclass(frozen=True)
class Calibration:
    """Attention-calibration settings.

    Args:
        basket_size: B, number of consecutive content keys per basket (>= 1).
        layers: which layers are calibrated.  ``int k`` = the last k layers;
            ``float f`` in (0, 1] = the last ``max(1, floor(f * N))`` layers;
            a sequence of ints = explicit 0-based layer indices.
        strength: alpha in [0, 1]; 0 = the stock model, 1 = full calibration.
        isolate_bos / isolate_eos: keep the first / last valid key out of the
            baskets.  :data:`POOLING_DECIDES` (default; ``None`` is taken for it): CLS
            pooling isolates BOS; last-token pooling isolates BOS and EOS; mean pooling
            isolates nothing.
        bos_weight / eos_weight: mass given to an isolated key: ``"equal"``
            (1 / n_total, the papers' formulation), ``"original"`` (the key is
            left alone) or a float in [0, 1).
        queries: ``"pool"`` (the pooling token's row) or ``"all"`` (every valid
            row).  :data:`POOLING_DECIDES` (default; ``None`` is taken for it): "pool"
            for CLS / last-token pooling, "all" for mean.
        prior: *positional-prior calibration* (a :class:`PositionalPrior`, or its dict):
            instead of giving every content basket the same mass, each basket's mass is
            divided by the prior's value at its relative position and the content is
            renormalised, so the average positional tilt goes and the row's content-driven
            variation stays.  ``None`` (default): the papers' equal mass per basket.
        self_share: *self-attention share* rho in [0, 1]: each calibrated query row keeps
            ``rho`` times the mass it originally gave its own key (the pooling token's key
            for CLS / last-token pooling, the diagonal key for every row with
            ``queries="all"``); the rest of the row is calibrated without that key and
            scaled to the remaining mass.  It takes precedence over ``bos_weight`` /
            ``eos_weight`` when the own key is an isolated key.  ``None`` (default): the
            own key is treated like any other key.
        trailing: what a *trailing basket* gets -- the last content basket when it is
            shorter than ``basket_size`` (``C`` not a multiple of B).  ``"basket"``
            (default, the papers' definition): it is a basket like the others, so every
            basket gets the same mass however few keys it holds (one extra token can take
            a whole basket's share).  ``"merge"``: a trailing basket shorter than B (any
            length 1..B-1) joins the basket before it, so there are ``max(1, floor(C / B))``
            baskets, each of B keys except the last, which holds B..2B-1; a text with
            ``C < 2B`` is then one basket and is left unchanged (unless an isolated key or
            a self-attention share moves mass).  ``"weighted"``: each basket's target mass
            is proportional to its number of keys (a basket of ``n`` keys counts ``n / B``
            baskets, so there are ``C / B`` baskets in all and ``"equal"`` isolated keys get
            ``1 / (C / B + #isolated)``); identical to ``"basket"`` when B divides C.  With
            a positional prior, a basket's target ``m_b / p_b`` already scales with its size
            (``p_b`` is a density), so ``"weighted"`` changes only the ``"equal"`` shares
            there; ``"merge"`` gives the merged basket one prior value, at its centre.
        schedule: how the strength is spread over the calibrated layers.  ``"flat"``
            (default, the papers'): ``strength`` in every calibrated layer.  ``"rising"``:
            the k-th of K calibrated layers (1-based, from the first) gets
            ``strength * k / K``, full strength in the last.  ``"falling"``:
            ``strength * (K - k + 1) / K``, full strength in the first.  ``strength`` 0
            is the stock model under every schedule.
        head_strengths: *per-head strengths*: a mapping layer -> one strength in [0, 1] per attention
            head of that layer (``{4: (0.5, 1.0, ...), 5: ...}``; JSON's string keys are taken), which
            replace the layer's strength head by head (the blend of step 7 with a per-head alpha); the
            layers must be calibrated ones.  Stored as ``((layer, (s0, s1, ...)), ...)`` sorted by layer.
            ``None`` (default): one strength per layer.  Fitted by :func:`posfair.repair.learned.fit_learned`.
        temperature: *TempScale* (Zhou et al., ACL 2025): the calibrated query rows of the calibrated
            layers become ``softmax(logits / T)`` before the basket formula (which then blends with the
            tempered row; ``strength=0`` is TempScale alone), on the texts the formula runs on (content of at
            least one basket).  ``None`` (default): off; 1 is the stock row.

    The third variant, *special-token mass* (a target share for the BOS / EOS keys
    distinct from the content baskets), is ``isolate_bos`` / ``isolate_eos`` with
    ``bos_weight`` / ``eos_weight``; :meth:`with_special` sets both at once and the
    command line's ``special=`` does the same.  New fields are written by
    :meth:`to_dict` (hence :meth:`key`) only when set, so settings without them keep
    their keys and labels.

    ``None`` means *off* (``prior``, ``self_share``); a setting the model's pooling decides
    holds :data:`POOLING_DECIDES`.  String forms: :meth:`label` (short), :meth:`describe`
    (words), :meth:`spec` (the command line; :meth:`parse` reads it back), all from one
    table; :meth:`key` digests :meth:`to_dict`.
    """

    basket_size: int = 128
    layers: int | float | tuple[int, ...] = 0.5
    strength: float = 0.5
    isolate_bos: bool | PoolingDecides = POOLING_DECIDES
    isolate_eos: bool | PoolingDecides = POOLING_DECIDES
    bos_weight: Share = "original"
    eos_weight: Share = "equal"
    queries: Literal["pool", "all"] | PoolingDecides = POOLING_DECIDES
    prior: PositionalPrior | None = None
    self_share: float | None = None
    trailing: Trailing = "basket"
    schedule: Schedule = "flat"
    head_strengths: Mapping[int, Sequence[float]] | tuple[tuple[int, tuple[float, ...]], ...] | None = None
    temperature: float | None = None

    def __post_init__(self) -> None:
        b = self.basket_size
        if isinstance(b, bool) or not isinstance(b, Integral) or b < 1:
            raise ValueError(f"basket_size must be an integer >= 1; got {b!r}")
        object.__setattr__(self, "basket_size", int(b))

        s = self.strength
        if isinstance(s, bool) or not isinstance(s, Real) or math.isnan(float(s)) or not 0.0 <= float(s) <= 1.0:
            raise ValueError(f"strength must be a number in [0, 1]; got {s!r}")
        object.__setattr__(self, "strength", float(s))

        object.__setattr__(self, "layers", _check_layers(self.layers))

        object.__setattr__(self, "bos_weight", _check_share("bos_weight", self.bos_weight))
        object.__setattr__(self, "eos_weight", _check_share("eos_weight", self.eos_weight))
        fixed = sum(w for w in (self.bos_weight, self.eos_weight) if isinstance(w, float))
        if fixed >= 1.0:
            raise ValueError(
                f"bos_weight + eos_weight = {fixed} leaves no attention mass for the content baskets; their sum must be < 1"
            )
        for name in ("isolate_bos", "isolate_eos", "queries"):  # None: the pooling decides
            if getattr(self, name) is None:
                object.__setattr__(self, name, POOLING_DECIDES)
        for name in ("isolate_bos", "isolate_eos"):
            v = getattr(self, name)
            if v is not POOLING_DECIDES and not isinstance(v, bool):
                raise ValueError(f"{name} must be True, False or None (the pooling decides); got {v!r}")
        if self.queries is not POOLING_DECIDES and self.queries not in ("pool", "all"):
            raise ValueError(f"queries must be 'pool', 'all' or None (the pooling decides); got {self.queries!r}")
        if self.prior is not None:
            object.__setattr__(self, "prior", PositionalPrior.from_dict(self.prior))
        rho = self.self_share
        if rho is not None:
            if (
                isinstance(rho, bool)
                or not isinstance(rho, Real)
                or math.isnan(float(rho))
                or not 0.0 <= float(rho) <= 1.0
            ):
                raise ValueError(f"self_share must be a number in [0, 1] or None; got {rho!r}")
            object.__setattr__(self, "self_share", float(rho))
        if not isinstance(self.trailing, str) or self.trailing not in TRAILING:
            raise ValueError(
                f"trailing must be one of {', '.join(repr(t) for t in TRAILING)} (what a last basket shorter than "
                f"basket_size gets); got {self.trailing!r}"
            )
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(repr(t) for t in SCHEDULES)} (how the strength is spread over "
                f"the calibrated layers); got {self.schedule!r}"
            )
        if self.head_strengths is not None:
            object.__setattr__(self, "head_strengths", _check_head_strengths(self.head_strengths))
        T = self.temperature
        if T is not None:
            if isinstance(T, bool) or not isinstance(T, Real) or not math.isfinite(float(T)) or not float(T) > 0:
                raise ValueError(f"temperature must be a finite number > 0 or None; got {T!r}")
            object.__setattr__(self, "temperature", float(T))

    # -- variants -----------------------------------------------------------------------------
    @property
    def variant(self) -> str:
        """Which variant this setting is: ``"uniform"`` (the papers'), ``"prior"``, ``"self"``, ``"special"``, or a
        combination named by its parts joined with ``+`` in that order (``"prior+special"``, ``"self+special"``, ...).
        """
        used = (self.prior is not None, self.self_share is not None, self.special_share is not None)
        parts = [name for name, on in zip(VARIANT_PARTS, used, strict=True) if on]
        return "+".join(parts) or "uniform"

    @property
    def special_share(self) -> Share | None:
        """The special-token share set by :meth:`with_special` (BOS and EOS isolated with one weight), else None."""
        if self.isolate_bos is True and self.isolate_eos is True and self.bos_weight == self.eos_weight:
            return self.bos_weight
        return None

    def with_special(self, share: Share) -> Calibration:
        """The special-token-mass variant: BOS and EOS isolated, each given ``share``
        (``"original"``: their own mass is kept; ``"equal"``: one basket's; a float: that share of the row)."""
        return replace(self, isolate_bos=True, isolate_eos=True, bos_weight=share, eos_weight=share)

    # -- resolution against a model ---------------------------------------------------------
    def layer_indices(self, num_layers: int) -> tuple[int, ...]:
        """The 0-based indices of the calibrated layers for a model with ``num_layers`` layers."""
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1; got {num_layers}")
        if isinstance(self.layers, tuple):
            bad = [i for i in self.layers if i >= num_layers]
            if bad:
                raise ValueError(
                    f"layers {bad} out of range: the model has {num_layers} layers (valid indices 0..{num_layers - 1})"
                )
            return self.layers
        if isinstance(self.layers, int):
            if self.layers > num_layers:
                raise ValueError(
                    f"layers={self.layers} asks for the last {self.layers} layers, but the model has only {num_layers}"
                )
            k = self.layers
        else:
            k = max(1, math.floor(self.layers * num_layers))
        return tuple(range(num_layers - k, num_layers))

    def pooled(self, pooling: str) -> Calibration:
        """This setting with every value :data:`POOLING_DECIDES` made concrete for a model with ``pooling``:
        CLS pooling isolates BOS, last-token pooling BOS and EOS, mean pooling nothing; mean pooling calibrates
        every query row (``"all"``), the others the pooling row (``"pool"``).  The one place the pooling decides."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}; got {pooling!r}")
        decided = dict(
            isolate_bos=pooling in ("cls", "lasttoken"),
            isolate_eos=pooling == "lasttoken",
            queries="all" if pooling == "mean" else "pool",
        )
        return replace(self, **{k: v for k, v in decided.items() if getattr(self, k) is POOLING_DECIDES})

    def isolation(self, pooling: str) -> tuple[bool, bool]:
        """``(isolate_bos, isolate_eos)`` for a model with ``pooling`` (:meth:`pooled`)."""
        concrete = self.pooled(pooling)
        return concrete.isolate_bos, concrete.isolate_eos

    def resolve(self, pooling: str, num_layers: int) -> ResolvedCalibration:
        """This setting for a model with ``pooling`` and ``num_layers`` layers (:meth:`pooled`, :meth:`layer_indices`)."""
        concrete = self.pooled(pooling)
        layers = self.layer_indices(num_layers)
        if self.prior is not None and self.prior.layers is not None:
            missing = [i for i in layers if i not in self.prior.layers]
            if missing:
                raise ValueError(
                    f"the positional prior covers layers {list(self.prior.layers)} but the calibration also calibrates layers {missing}"
                )
        extra = [i for i, _ in self.head_strengths or () if i not in layers]
        if extra:
            raise ValueError(f"head_strengths are given for layers {extra}, which are not calibrated (layers {layers})")
        values = {f.name: getattr(concrete, f.name) for f in fields(Calibration)}
        return ResolvedCalibration(**{**values, "layers": layers, "pooling": pooling})

    # -- (de)serialisation and the string forms (one table, :data:`_FORMS`) ---------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; :data:`POOLING_DECIDES` as ``null``; the fields added after the first release
        (``prior``, ``self_share``, ``trailing``, ``schedule``) only when not the default (so older settings keep
        their keys)."""
        d = asdict(self)
        if isinstance(d["layers"], tuple):
            d["layers"] = list(d["layers"])
        for form in _FORMS:
            if d[form.field] is POOLING_DECIDES:
                d[form.field] = None
            if not form.keyed_at_default and form.at_default(getattr(self, form.field)):
                del d[form.field]
        if self.prior is not None:
            d["prior"] = self.prior.to_dict()
        if self.head_strengths is not None:
            d["head_strengths"] = {str(i): list(v) for i, v in self.head_strengths}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Calibration:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown calibration fields: {sorted(unknown)}")
        d = dict(d)
        if isinstance(d.get("layers"), list):
            d["layers"] = tuple(d["layers"])
        if d.get("prior") is not None:
            d["prior"] = PositionalPrior.from_dict(d["prior"])
        return cls(**d)

    def key(self) -> str:
        """A short stable identifier of :meth:`to_dict` (used in cache keys and file names)."""
        blob = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def _given(self) -> list[tuple[_Form, Any]]:
        """The settings beyond ``B,layers,alpha`` that are not at their default, in :data:`_FORMS` order."""
        return [(form, v) for form in _FORMS if not form.at_default(v := getattr(self, form.field))]

    def label(self) -> str:
        """The one name of the setting, in every output (terminal, tables, reports, figures, file names, serve), e.g.
        ``B128-L0.5-a0.5``, ``B16-Llast1-a1-bos1-eos1-bw0.1-ew0.1`` (layers as :func:`layers_label` writes them:
        ``Llast1`` the last layer, ``Lall`` every layer; a prior by its shape and digest).  :meth:`parse` reads it
        back (a prior's or per-head strengths' values, which it names by a digest only, given after it)."""
        head = [f"B{self.basket_size}", f"L{layers_label(self.layers)}", f"a{self.strength:g}"]
        return "-".join(head + [form.label(v) for form, v in self._given()])

    def figure_label(self) -> str:
        """:meth:`label` as a figure names the variant, the way the command line spells it: a prior without its shape
        and digest (``B16-L0.5-a1-prior``), BOS and EOS isolated with one share as ``special=SHARE``
        (``B16-L0.5-a1-special=0.1``); built from the fields, never from the label's text."""
        special = self.isolate_bos is True and self.isolate_eos is True and str(self.bos_weight) == str(self.eos_weight)
        parts = [f"B{self.basket_size}", f"L{layers_label(self.layers)}", f"a{self.strength:g}"]
        for form, v in self._given():
            if special and form.field in ("isolate_bos", "isolate_eos", "bos_weight", "eos_weight"):
                if f"special={self.bos_weight}" not in parts:
                    parts.append(f"special={self.bos_weight}")
            else:
                parts.append("prior" if form.field == "prior" else form.label(v))
        return "-".join(parts)

    def describe(self) -> str:
        """The calibration in words, for a person beside its :meth:`label`, e.g. "baskets of 128 tokens, the
        last 50% of layers, strength 0.5" for ``B128-L0.5-a0.5``."""
        if isinstance(self.layers, tuple):
            layers = f"layers {', '.join(str(i) for i in self.layers)} (0-based)"
        elif isinstance(self.layers, float):
            layers = "every layer" if self.layers >= 1 else f"the last {self.layers:.0%} of layers"
        else:
            layers = "the last layer" if self.layers == 1 else f"the last {self.layers} layers"
        parts = [f"baskets of {self.basket_size} tokens", layers, f"strength {self.strength:g}"]
        return ", ".join(parts + [form.words(v) for form, v in self._given()])

    @classmethod
    def parse(cls, spec: str) -> Calibration:
        """Parse the command-line form ``B,LAYERS,ALPHA[,NAME=VALUE...]`` (e.g. ``128,0.5,0.5``, ``512,1,1.0``,
        ``128,6+7+8,1``, ``16,1.0,1,prior=prior.json``) or ``default`` (the robust default
        ``Calibration()``, i.e. ``128,0.5,0.5``); what :meth:`spec` writes reads back to the same setting.

        ``LAYERS``: an int (last k layers), a float with a dot (fraction), or ``+``-separated explicit
        0-based indices (one index: ``5+``).  Settings (any combination, each once):
        ``prior=FILE`` (a positional prior, the JSON written by ``posfair estimate-prior``),
        ``self=RHO`` (self-attention share in [0, 1]), ``special=SHARE`` (BOS and EOS
        isolated, each given ``original``, ``equal`` or a float share), ``trailing=POLICY``
        (what a last basket shorter than B gets: ``basket``, ``merge`` or ``weighted``),
        ``schedule=SCHEDULE`` (the strength over the calibrated layers: ``flat``, ``rising`` or ``falling``),
        ``heads=LAYER:S/S/...[+LAYER:S/S/...]`` (per-head strengths, e.g. ``heads=4:0.5/1/0+5:1/1/0.25``),
        ``temp=T`` (TempScale's attention temperature);
        and the fields ``special=`` sets, one by one (``isolate_bos=true|false``, ``isolate_eos=true|false``,
        ``bos_weight=SHARE``, ``eos_weight=SHARE``), and ``queries=pool|all`` (the last three left out: the
        model's pooling decides).

        Also a label as :meth:`label` and :meth:`figure_label` print it (``B128-L0.5-a0.5``, ``B64-Llast1-a1``,
        ``B16-L0.5-a1-rising``), read back to the setting it names
        (:func:`~posfair.calibration.spelling.read_label`); a prior or per-head strengths, which a label names
        by a digest only, follow it as in a spec (``B16-L0.5-a1-prior20x6.1a2b3c,prior=prior.json``) and must
        have that digest.  A misspelt word gets a suggestion (``defualt``: did you mean 'default'?).
        """
        if spec.strip().lower() == "default":
            return cls()
        if is_label(spec):
            return cls(**read_label(spec))
        parts = [p.strip() for p in spec.split(",")]
        head = [p for p in parts if "=" not in p]
        tail = [p for p in parts if "=" in p]
        if len(head) != 3 or parts[:3] != head:
            word = spec.strip().lower() if len(parts) == 1 and not tail else ""
            raise ValueError(
                f"calibration spec must be 'BASKET,LAYERS,STRENGTH' (e.g. 128,0.5,0.5), optionally followed by "
                f"{_KNOWN_SETTINGS}, a label as tables print it (e.g. B128-L0.5-a0.5), or 'default'; got {spec!r}"
                + did_you_mean(word, ("default",))
            )
        b, layers_s, a = head
        try:
            basket = int(b)
        except ValueError:
            raise ValueError(f"basket size in calibration spec {spec!r} must be an integer; got {b!r}") from None
        layers = parse_layers(layers_s)
        try:
            strength = float(a)
        except ValueError:
            raise ValueError(f"strength in calibration spec {spec!r} must be a number; got {a!r}") from None
        kw: dict[str, Any] = {}
        given: list[str] = []  # the spec's own names (self= is stored as self_share, special= as four fields)
        for item in tail:
            name, _, value = (x.strip() for x in item.partition("="))
            if name in given:
                raise ValueError(f"calibration spec {spec!r} gives {name}= twice")
            given.append(name)
            where = f"{name}= in calibration spec {spec!r}"
            if name == "special":
                share = _read_share(value, where)
                kw.update({f: share if "weight" in f else True for f in _SPECIAL_FIELDS})
            elif name in _FORM_BY_NAME:
                form = _FORM_BY_NAME[name]
                kw[form.field] = form.read(value, where)
            else:
                known = ["special", *_FORM_BY_NAME]
                raise ValueError(
                    f"unknown variant {name!r} in calibration spec {spec!r} (known: {_KNOWN_SETTINGS})"
                    + did_you_mean(name, known)
                )
        both = [n for n in given if n in _SPECIAL_FIELDS]
        if "special" in given and both:
            raise ValueError(
                f"calibration spec {spec!r} gives special= and {'= and '.join(both)}=: special= sets "
                f"{', '.join(_SPECIAL_FIELDS)} (give special= or those fields)"
            )
        return cls(basket_size=basket, layers=layers, strength=strength, **kw)

    def spec(self, prior_file: str = "PRIOR.json") -> str:
        """The command-line form of this setting, which :meth:`parse` reads back to it: ``Calibration.parse(
        c.spec(f)) == c`` when the file ``f`` holds ``c``'s prior (``prior_file`` stands for the prior's file)."""
        out = [str(self.basket_size), _layers_text(self.layers, exact=True), _number(self.strength)]
        given = dict((form.field, v) for form, v in self._given())
        special = self.special_share
        for name in _SPEC_ORDER:
            if name == "special":
                if special is not None:
                    out.append(f"special={special}")
            elif name in given and not (special is not None and name in _SPECIAL_FIELDS):
                form = _FORM_BY_FIELD[name]
                out.append(f"{form.name}={prior_file if name == 'prior' else form.text(given[name])}")
        return ",".join(out)
