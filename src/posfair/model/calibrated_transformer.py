"""The sentence-transformers input module that calibrates: :class:`CalibratedTransformer`.

A sentence-transformers ``Transformer`` that knows how to calibrate its model's
attention: it switches the model to posfair's registered attention function when
the model dispatches through transformers' registry, else installs the fallback
interception (which mechanism is probed once, :attr:`CalibratedTransformer.mechanism`),
and in ``forward`` sets the :class:`~posfair.calibration.state.ForwardState` the
backends read.  It stores a default calibration and the pooling in
``sentence_bert_config.json``, so a saved folder reloads calibrated.

Which calibration a forward pass runs with is its default unless a
:func:`calibration_override` is active around the call (``FairModel.using`` /
``encode(calibration=...)``); :func:`attention_recording` adds a recorder of the
pooling token's attention rows.  Both are context variables, so concurrent
threads each see their own.

Saving and loading: ``FairModel.save`` writes the module as the stock ``Transformer``
(:func:`stock_module_type`).  With a default calibration, for the architectures whose row in
:mod:`posfair.calibration.backends` says ``flag_free``, :func:`write_flag_free` then records the calibration in
the folder's ``config.json`` with ``attn_implementation="posfair_sdpa"``, so plain
``SentenceTransformer(path)`` loads it calibrated after ``import posfair``; when such a
folder is loaded as a ``FairModel``, this module takes the calibration over from the
config.  Other architectures keep the previous format, whose ``modules.json`` names
this class: :func:`saved_with_posfair` tells such a folder and :data:`MODULE_CLASSES`
maps the name to the class.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from posfair.calibration import attention_wiring as att
from posfair.calibration import backends, fallback
from posfair.calibration.choice import STOCK, Resolved, check_choice
from posfair.calibration.params import POOLINGS, Calibration, ResolvedCalibration
from posfair.calibration.state import CONFIG_CALIBRATION_KEY, CONFIG_POOLING_KEY
from posfair.files.atomic import atomic_write_json, atomic_write_text
from posfair.model import compat, stock_layers
from posfair.model.compat import Transformer

__all__ = [
    "CalibratedTransformer",
    "MODULE_CLASSES",
    "Mechanism",
    "Route",
    "attention_recording",
    "calibration_override",
    "effective_calibration",
    "flag_free",
    "make_calibrated",
    "saved_with_posfair",
    "stock_module_type",
    "write_flag_free",
    "write_model_card_note",
]

_UNSET = object()
# per-call calibration override: _UNSET = use the module's default; else a Calibration or STOCK
_OVERRIDE: contextvars.ContextVar[Any] = contextvars.ContextVar("posfair_override", default=_UNSET)
# attention recorder for the attention profile: (recorder, layers, queries) or None
_RECORDING: contextvars.ContextVar[tuple[att.Recorder, frozenset[int], str] | None] = contextvars.ContextVar(
    "posfair_recording", default=None
)

# Registered at import so that a pickled model (e.g. in sentence-transformers' multi-process
# workers) finds posfair's attention functions when it is unpickled.
att.register()


def effective_calibration(default: Resolved) -> Resolved:
    """The calibration a forward pass runs with now (a Calibration or STOCK): the one of an active
    :func:`calibration_override`, else ``default``."""
    override = _OVERRIDE.get()
    return default if override is _UNSET else override


@contextlib.contextmanager
def calibration_override(calibration: Resolved) -> Iterator[None]:
    """Within the block, every forward pass runs with ``calibration`` (a Calibration or STOCK) instead of its default."""
    check_choice(calibration, model_default=False)
    token = _OVERRIDE.set(calibration)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


@contextlib.contextmanager
def attention_recording(recorder: att.Recorder, layers: Sequence[int], queries: str = "pool") -> Iterator[None]:
    """Within the block, forward passes call ``recorder(layer, rows)`` for ``layers`` (see ``FairModel.recording_attention``)."""
    token = _RECORDING.set((recorder, frozenset(layers), queries))
    try:
        yield
    finally:
        _RECORDING.reset(token)


def _num_layers(config) -> int:
    for cfg in (config, getattr(config, "text_config", None)):
        n = getattr(cfg, "num_hidden_layers", None) if cfg is not None else None
        if isinstance(n, int) and n > 0:
            return n
    raise TypeError(f"cannot tell how many layers {type(config).__name__} has (no num_hidden_layers)")


#: how calibration reaches a model's attention: transformers' attention registry, or the fallback interception
Mechanism = Literal["registry", "fallback"]


class Route(enum.Enum):
    """Where a :class:`CalibratedTransformer` stands in finding its attention route: ``UNPROBED`` (its first use
    probes: the registry if a forward pass sees every layer through it, else the fallback) -> ``REGISTRY``; or
    ``FALLBACK`` (known from the table of backends, or a model that cannot switch; the interception not installed
    yet) -> ``FALLBACK_CHECKED`` (installed, and a probe saw every layer through it).  A copy (pickle, deepcopy)
    of a checked fallback goes back to ``FALLBACK``: its modules are its own to find again."""

    UNPROBED = enum.auto()
    REGISTRY = enum.auto()
    FALLBACK = enum.auto()
    FALLBACK_CHECKED = enum.auto()


class CalibratedTransformer(Transformer):
    """A sentence-transformers ``Transformer`` whose attention can be calibrated.

    Extra config keys (saved in ``sentence_bert_config.json``):
    ``posfair_calibration`` (a :class:`Calibration` as a dict, or None for none) and
    ``posfair_pooling`` ("cls" / "mean" / "lasttoken").

    Texts are tokenised as given, on both stacks: nothing is stripped (sentence-transformers 6.x
    strips nothing; 5.x's ``tokenize`` strips each text, which this class leaves out), so a text
    ending in a space keeps the trailing "▁" token of a SentencePiece vocabulary, as the model's
    tokenizer called on the text gives it.
    """

    config_keys = [*Transformer.config_keys, "posfair_calibration", "posfair_pooling"]

    def __init__(self, *args, posfair_calibration: dict | None = None, posfair_pooling: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._posfair_init(posfair_calibration, posfair_pooling)

    if not compat.ST_6:  # 5.x: its tokenize strips each text first; posfair's tokenises it as given (as 6.x does)

        def tokenize(self, texts: list, padding: str | bool = True) -> dict[str, Any]:
            return compat.tokenize_as_given(self, texts, padding)

    # -- setup -----------------------------------------------------------------------------
    def _posfair_init(self, calibration: dict | Calibration | None, pooling: str | None) -> None:
        model = self.auto_model
        # a flag-free calibrated folder (see save_flag_free) carries its calibration in config.json: from here
        # on this module owns it (so encode(calibration=STOCK) is stock), and save() writes it back
        saved_cal = model.config.__dict__.pop(CONFIG_CALIBRATION_KEY, None)
        saved_pooling = model.config.__dict__.pop(CONFIG_POOLING_KEY, None)
        if calibration is None:
            calibration, pooling = saved_cal, pooling or saved_pooling
        if isinstance(calibration, dict):
            calibration = Calibration.from_dict(calibration)
        self.default_calibration: Resolved = (
            STOCK if calibration is None else check_choice(calibration, model_default=False)
        )
        self.posfair_pooling = pooling
        self._route = Route.UNPROBED
        self._resolved: dict[Calibration, ResolvedCalibration] = {}
        self._attention_modules = None
        att.register()
        self.num_layers = _num_layers(model.config)
        self._refresh_identity()
        base = getattr(model.config, "_attn_implementation", None)
        if base in (att.ATTN_SDPA, att.ATTN_EAGER):
            return  # already posfair's (a calibrated folder): the probe tells the route it takes
        if self.backend_row.route(compat.TRANSFORMERS_5) == backends.FALLBACK:  # the table of backends says so
            self._route = Route.FALLBACK
            return
        try:
            compat.set_attn_implementation(model, att.ATTN_SDPA)
        except Exception:  # a model of no row that cannot switch (remote code, ...): the fallback interception
            self._route = Route.FALLBACK
            return
        if getattr(model.config, "_attn_implementation", None) != att.ATTN_SDPA:
            self._route = Route.FALLBACK

    def _refresh_identity(self) -> None:
        """The config objects of this model's modules: the attention function acts only on these."""
        model = self.auto_model
        self._config_ids = frozenset(
            {id(model.config)} | {id(m.config) for m in model.modules() if hasattr(m, "config")}
        )

    def __setstate__(self, state: dict) -> None:  # unpickled / deep-copied: new config objects
        super().__setstate__(state)
        self._refresh_identity()
        if self._route is Route.FALLBACK_CHECKED:  # the interception's modules are this copy's to find again
            self._route = Route.FALLBACK
        self._attention_modules = None

    @property
    def route(self) -> Route:
        """Where this module stands in finding its attention route (:class:`Route`)."""
        return self._route

    def reprobe(self) -> None:
        """Forget the route: the next use probes the model again (after its attention modules were swapped)."""
        self._route, self._attention_modules = Route.UNPROBED, None

    @property
    def backend_row(self) -> backends.Backend:
        """This model's row in the table of backends (:mod:`posfair.calibration.backends`): remote code is a model
        whose class is not transformers' own."""
        model = self.auto_model
        remote = not type(model).__module__.startswith("transformers.")
        return backends.backend_for(getattr(model.config, "model_type", None), remote_code=remote)

    @property
    def posfair_calibration(self) -> dict | None:
        return None if self.default_calibration is STOCK else self.default_calibration.to_dict()

    def get_config_dict(self) -> dict[str, Any]:
        d = super().get_config_dict()
        d["posfair_calibration"] = self.posfair_calibration
        d["posfair_pooling"] = self.posfair_pooling
        return d

    def resolve(self, calibration: Calibration) -> ResolvedCalibration:
        if self.posfair_pooling not in POOLINGS:
            raise ValueError(
                f"cannot calibrate: the pooling is {self.posfair_pooling!r}; pass pooling='cls', 'mean' or 'lasttoken' to load_model"
            )
        if calibration not in self._resolved:
            self._resolved[calibration] = calibration.resolve(self.posfair_pooling, self.num_layers)
        return self._resolved[calibration]

    @contextlib.contextmanager
    def resolving(self, calibration: Calibration, resolved: ResolvedCalibration) -> Iterator[None]:
        """Within the block, ``calibration`` runs as ``resolved`` (its own resolution with per-head strengths
        that autograd tracks: a fit, :mod:`posfair.repair.learned`); resolved as before after it."""
        self.resolve(calibration)  # validated against this model
        before = self._resolved[calibration]
        self._resolved[calibration] = resolved
        try:
            yield
        finally:
            self._resolved[calibration] = before

    def set_attention_base(self, base: str) -> None:
        """Switch between the fast path (``"sdpa"``) and the explicit full-matrix path (``"eager"``)."""
        name = {"sdpa": att.ATTN_SDPA, "eager": att.ATTN_EAGER}[base]
        if self._mode() != "registry":
            raise TypeError(f"{type(self.auto_model).__name__} does not use transformers' attention registry")
        compat.set_attn_implementation(self.auto_model, name)

    # -- mechanism detection ---------------------------------------------------------------------
    def _probe_inputs(self) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(["posfair probe text"], return_tensors="pt")
        dev = next(self.auto_model.parameters()).device
        return {k: v.to(dev) for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}

    def _mode(self) -> Mechanism:
        if self._route is Route.REGISTRY:
            return "registry"
        if self._route is Route.FALLBACK_CHECKED:
            return "fallback"
        model = self.auto_model
        inputs = self._probe_inputs()
        B, L = inputs["input_ids"].shape
        start, end = att.spans_from_mask(inputs.get("attention_mask"), B, L, inputs["input_ids"].device)
        every = frozenset(range(self.num_layers))
        if self._route is Route.UNPROBED:
            state = att.ForwardState(self._config_ids, start, end, pooling=self.posfair_pooling or "cls")
            with torch.no_grad(), att.forward_state(state):
                model(**inputs)
            if every <= state.visited:
                self._route = Route.REGISTRY
                return "registry"
        # fallback: intercept softmax / SDPA inside each layer's attention module (posfair.calibration.fallback)
        modules = fallback.find_layer_attention_modules(model, self.num_layers)
        fallback.install(modules)
        state = att.ForwardState(
            self._config_ids,
            start,
            end,
            recorder=lambda _l, _r: None,
            record_layers=every,
            pooling=self.posfair_pooling or "cls",
            length=L,
            fallback_layers=fallback.layer_map(modules),
        )
        with torch.no_grad(), att.forward_state(state), fallback.active(state):
            model(**inputs)
        fallback.verify(state, type(model).__name__, probe=True)
        self._attention_modules = modules
        self._route = Route.FALLBACK_CHECKED
        return "fallback"

    @property
    def mechanism(self) -> Mechanism:
        """ "registry" or "fallback": how calibration reaches this model's attention."""
        return self._mode()

    # -- stock layers shared between stock and calibrated passes (posfair.model.stock_layers) --------------
    def layer_stack(self):
        """The model's stack of transformer layers (None if not found structurally)."""
        cached = self.__dict__.get("_posfair_layer_stack")
        if cached is None or cached[0] is not self.auto_model:
            stack = stock_layers.find_layer_stack(self.auto_model, self.num_layers)
            if stack is not None:
                stock_layers.install(stack)
            cached = (self.auto_model, stack)
            self.__dict__["_posfair_layer_stack"] = cached
        return cached[1]

    def first_calibrated_layer(self, calibration: Resolved) -> int | None:
        """The lowest layer ``calibration`` changes (None for STOCK or a calibration of no layer)."""
        if calibration is STOCK:
            return None
        layers = self.resolve(calibration).layer_set
        return min(layers) if layers else None

    def _stock_layers_part(self, features: dict[str, Any], cal: Resolved, recording, kwargs: dict):
        share = stock_layers.active_sharing()
        if share is None or recording is not None:
            return None
        if kwargs.get("output_hidden_states") or getattr(self.auto_model.config, "output_hidden_states", False):
            return None  # the layers in between are read
        stack = self.layer_stack()
        if stack is None:
            return None
        self._mode()  # the mechanism probe (a forward pass of its own) runs before, never inside, this pass's part
        first = self.first_calibrated_layer(cal)
        if cal is not STOCK and first is None:
            return None
        return stock_layers.batch_part(share, id(stack), features, first)

    # -- forward ------------------------------------------------------------------------------
    def forward(self, features: dict[str, Any], **kwargs) -> dict[str, Any]:
        cal = effective_calibration(self.default_calibration)
        recording = _RECORDING.get()
        with stock_layers.batch_scope(self._stock_layers_part(features, cal, recording, kwargs)):
            return self._forward(features, cal, recording, **kwargs)

    def _forward(self, features: dict[str, Any], cal: Resolved, recording, **kwargs) -> dict[str, Any]:
        if cal is STOCK and recording is None:
            return super().forward(features, **kwargs)
        ids = features.get("input_ids")
        if ids is None:
            raise TypeError("posfair calibration needs token inputs (input_ids)")
        B, L = ids.shape[:2]
        start, end = att.spans_from_mask(features.get("attention_mask"), B, L, ids.device)
        state = att.ForwardState(
            self._config_ids,
            start,
            end,
            calibration=None if cal is STOCK else self.resolve(cal),
            pooling=self.posfair_pooling or "cls",
        )
        if recording is not None:
            state.recorder, state.record_layers, state.record_queries = recording
        with contextlib.ExitStack() as stack:
            stack.enter_context(att.forward_state(state))
            if self._mode() != "fallback":
                return super().forward(features, **kwargs)
            state.length = L
            state.fallback_layers = fallback.layer_map(self._attention_modules)
            stack.enter_context(fallback.active(state))
            out = super().forward(features, **kwargs)
            fallback.verify(state, type(self.auto_model).__name__)
            return out


# Saved folders name each module by ``type(module).__module__`` in modules.json, and pickles name
# classes the same way: the class keeps its public home, ``posfair.model.CalibratedTransformer``,
# so folders saved by any posfair version load in any other.
CalibratedTransformer.__module__ = "posfair.model"

#: the modules.json type of a posfair folder -> the class that loads it
MODULE_CLASSES: dict[str, type] = {
    f"{CalibratedTransformer.__module__}.{CalibratedTransformer.__name__}": CalibratedTransformer
}


def make_calibrated(module: Transformer) -> CalibratedTransformer:
    """Turn a loaded stock ``Transformer`` module into a :class:`CalibratedTransformer` in place
    (no default calibration; the pooling is set by the caller)."""
    if not isinstance(module, CalibratedTransformer):
        module.__class__ = CalibratedTransformer
        module._posfair_init(None, None)
    return module


@contextlib.contextmanager
def stock_module_type(module: Transformer, always: bool = False) -> Iterator[None]:
    """Within the block, a :class:`CalibratedTransformer` without a default calibration (with
    ``always``, any) is a stock ``Transformer``: what ``save`` then writes loads without posfair's class."""
    if not isinstance(module, CalibratedTransformer) or (module.default_calibration is not STOCK and not always):
        yield
        return
    module.__class__ = Transformer
    module._posfair_saved_as_stock = True
    try:
        yield
    finally:
        del module._posfair_saved_as_stock
        module.__class__ = CalibratedTransformer


@contextlib.contextmanager
def calibrated_while_saving(modules) -> Iterator[None]:
    """Within the block, a module that :func:`stock_module_type` shows as a stock ``Transformer`` (a save in
    progress) is posfair's class again: what runs inside a save (sentence-transformers' model card encodes
    its usage examples) encodes as the model does, calibrated, not stock."""
    saving = [m for m in modules if getattr(m, "_posfair_saved_as_stock", False)]
    for m in saving:
        m.__class__ = CalibratedTransformer
    try:
        yield
    finally:
        for m in saving:
            m.__class__ = Transformer


def flag_free(module: CalibratedTransformer) -> bool:
    """Whether ``module`` saves as a flag-free calibrated folder (:func:`write_flag_free`); else a
    calibrated save names :class:`CalibratedTransformer` in ``modules.json`` (the previous format:
    it loads with ``posfair.load_model``, or with ``trust_remote_code=True`` on sentence-transformers 6)."""
    config = module.auto_model.config
    return module.backend_row.flag_free and not getattr(config, "auto_map", None)


def write_flag_free(folder: Path, module: CalibratedTransformer) -> None:
    """Turn the stock ``Transformer`` folder just written for ``module`` into a calibrated one.

    ``config.json`` gets ``attn_implementation: "posfair_sdpa"`` (the attention function posfair
    registers with transformers) and the calibration and pooling (``posfair_calibration``,
    ``posfair_pooling``: transformers keeps unknown keys as config attributes, and the
    registered function reads them); ``sentence_bert_config.json`` gets the same
    ``attn_implementation`` in ``model_args``, which sentence-transformers passes to
    ``from_pretrained``; and ``_attn_implementation_internal`` for ``AutoModel`` on transformers 4.x,
    which drops ``attn_implementation`` from ``config.json``.
    """
    config_path, st_path = folder / "config.json", folder / "sentence_bert_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["attn_implementation"] = att.ATTN_SDPA
    # transformers 4.x drops "attn_implementation" when it reads config.json but sets the leftover keys as
    # attributes, this one being where its config keeps the implementation; 5.x skips this key
    config["_attn_implementation_internal"] = att.ATTN_SDPA
    config[CONFIG_CALIBRATION_KEY] = module.default_calibration.to_dict()
    config[CONFIG_POOLING_KEY] = module.posfair_pooling
    atomic_write_json(config_path, config)
    st_config = json.loads(st_path.read_text(encoding="utf-8")) if st_path.is_file() else {}
    st_config.setdefault("model_args", {})["attn_implementation"] = att.ATTN_SDPA  # the key both 5.x and 6.x read
    atomic_write_json(st_path, st_config)


def model_card_note(module: CalibratedTransformer, flag_free_folder: bool) -> str:
    """What a calibrated folder's README says about loading it."""
    cal = json.dumps(module.default_calibration.to_dict(), sort_keys=True)
    head = (
        "## Calibrated with posfair\n\n"
        "The pooling token's attention of this model is calibrated at inference time by posfair "
        f"(pooling `{module.posfair_pooling}`, calibration `{cal}`): in the chosen layers its attention row "
        "gives every contiguous basket of tokens equal mass, which reduces the model's bias towards the "
        "start of long texts.  Loading it needs posfair installed (`pip install -e .` in a clone of the posfair repository; posfair is not on PyPI).\n\n"
    )
    if flag_free_folder:
        return head + (
            "```python\n"
            "import posfair  # registers posfair's attention function with transformers\n"
            "from sentence_transformers import SentenceTransformer\n\n"
            'model = SentenceTransformer("path/or/hub-id")  # calibrated; no trust_remote_code\n'
            "```\n\n"
            'Without `import posfair` loading fails with `Specified attn_implementation="posfair_sdpa" is not supported`. '
            "With transformers alone: `import posfair` then `AutoModel.from_pretrained(path)`.  "
            "`posfair.load_model(path)` loads it as a posfair `FairModel`.\n"
        )
    return head + (
        "```python\n"
        "import posfair\n\n"
        'model = posfair.load_model("path/or/hub-id")\n'
        "```\n\n"
        "This architecture's calibrated folders name posfair's module class in `modules.json`: plain "
        "sentence-transformers 6 loads them only with `trust_remote_code=True`.\n"
    )


def write_model_card_note(folder: Path, module: CalibratedTransformer, flag_free_folder: bool) -> None:
    """Add :func:`model_card_note` to the folder's README.md (after its front matter; a README with only
    the note when sentence-transformers wrote none)."""
    readme = folder / "README.md"
    note = model_card_note(module, flag_free_folder)
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    if "## Calibrated with posfair" in text:
        return
    if text.startswith("---\n") and "\n---\n" in text[4:]:
        end = text.index("\n---\n", 4) + len("\n---\n")
        text = text[:end] + "\n" + note + "\n" + text[end:]
    else:
        text = note + ("\n" + text if text else "")
    atomic_write_text(readme, text)


def saved_with_posfair(path: str) -> bool:
    """Whether the folder ``path`` holds a module saved by posfair (its modules.json names one)."""
    modules = Path(path) / "modules.json"
    if not modules.is_file():
        return False
    try:
        entries = json.loads(modules.read_text())
    except (OSError, ValueError):
        return False
    return any(str(e.get("type", "")).startswith("posfair.") for e in entries)
