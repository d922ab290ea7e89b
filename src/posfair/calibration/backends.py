"""The table of backends: which route calibrates which architecture, on which stack.

posfair reaches a model's attention by one of three routes, one module each under
:mod:`posfair.calibration`:

``registry`` (:mod:`posfair.calibration.registry`)
    posfair's attention function, registered in transformers' ``AttentionInterface`` under
    :data:`ATTN_SDPA`; the model is switched to it by name.  Only this route has the explicit
    full-matrix reference path (:data:`ATTN_EAGER`, ``set_attention_base("eager")``).
``transformers4`` (:mod:`posfair.calibration.transformers4`)
    transformers 4.x only, for a calibrated folder loaded *without* posfair's model class (plain
    ``SentenceTransformer(path)`` / ``AutoModel.from_pretrained(path)`` after ``import posfair``):
    a :data:`ATTN_SDPA` entry added to the architecture's own attention table
    (``BERT_SELF_ATTENTION_CLASSES``, ...), whose layers run the fallback's per-layer interception.
``fallback`` (:mod:`posfair.calibration.fallback`)
    a scoped ``TorchFunctionMode`` that intercepts each layer's softmax / SDPA call (remote code, and
    architectures that pick their attention classes themselves on transformers 4.x).

Every route ends in the same explicit kernels (:func:`posfair.calibration.kernels.attend`: the pooling
row recomputed explicitly; all rows by the fused per-basket kernel of :mod:`posfair.calibration.fused`
on CPU or :mod:`posfair.calibration.cuda_rows` on CUDA where they apply, else in tiles), so the routes
calibrate identically; the kernels are not chosen per architecture.

:data:`BACKENDS` has one row per architecture (``config.model_type``; remote code is a row of its own,
since e.g. jina-embeddings-v3 declares ``model_type="xlm-roberta"`` but runs its own code); an
architecture with no row takes :data:`DEFAULT`, which :data:`PROBE` s: the registry when the model can
switch to it and a probe forward pass sees every layer through it, else the fallback (and a model
neither reaches gets a ``TypeError`` naming its class).  Read by:

- ``posfair/__init__.py`` (:func:`import_hooks`): which transformers modules, once imported, run which
  route's ``on_import`` -- the registry's registration, the 4.x attention tables' extension;
- :class:`posfair.model.calibrated_transformer.CalibratedTransformer` (:func:`backend_for`): a row
  whose route on the running stack is ``fallback`` goes straight to the interception, the others
  switch to the registry and probe; and which architectures save flag-free folders;
- :mod:`posfair.calibration.transformers4` (:func:`attention_tables`): which tables it extends;
- the README's support table ("Supported stacks and models"), checked against this one by
  ``tests/test_backends.py``, as is each row's route against what the dispatch takes for a seeded tiny
  model of that architecture (``tests/tiny_models.py``).

What a new architecture needs: one row here and a tiny model in the test.

1. Add a :class:`Backend` row: ``model_types`` (its ``config.model_type``), ``readme`` (the first cell of
   its row in the README's support table: add that row too), and the route on each stack --
   ``registry`` where its attention goes through ``ALL_ATTENTION_FUNCTIONS`` (transformers 5.x: nearly
   every architecture; 4.x: those whose model class sets ``_supports_attention_backend``), else
   ``fallback``.  ``flag_free=True`` when a calibrated folder must load with plain
   ``SentenceTransformer(path)`` on both stacks: the route of such a loading is the registry, or on 4.x,
   for an architecture that picks its attention class itself, its attention table -- then also give
   ``modelling`` (its modelling module under ``transformers.models``, e.g. ``"bert.modeling_bert"``) and
   ``table_4`` (the table's name in that module on 4.x and whether its entries are ``"class"`` es taking
   ``(config, ...)`` with ``forward(hidden_states, attention_mask, ...)`` or ``"function"`` s taking
   ``(module, qkv, attention_mask, ...)``; a table of another shape needs a builder in
   :mod:`posfair.calibration.transformers4`).
2. Add a seeded tiny config of it to ``tests/tiny_models.py`` (``_configs``, keyed by a name whose config
   has that ``model_type``); ``tests/test_backends.py`` then checks the route on the installed stack
   (CI runs both stacks).

This module imports nothing but the standard library (``import posfair`` reads it before torch).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ATTN_EAGER",
    "ATTN_SDPA",
    "BACKENDS",
    "DEFAULT",
    "FALLBACK",
    "PROBE",
    "REGISTRY",
    "REGISTRY_MODULE",
    "ROUTE_MODULES",
    "TRANSFORMERS4",
    "Backend",
    "attention_tables",
    "backend_for",
    "import_hooks",
    "install_import_hooks",
]

#: the attention implementation posfair registers with transformers (and a calibrated folder's config names)
ATTN_SDPA = "posfair_sdpa"
#: the explicit full-matrix implementation: the slow reference and the "naive" benchmark baseline (registry only)
ATTN_EAGER = "posfair_eager"

REGISTRY = "registry"
TRANSFORMERS4 = "transformers4"
FALLBACK = "fallback"
PROBE = "probe"  # no row: the registry if a probe forward pass sees every layer through it, else the fallback

#: route -> the module that implements it (each has ``on_import(module)`` where :func:`import_hooks` names it)
ROUTE_MODULES = {
    REGISTRY: "posfair.calibration.registry",
    TRANSFORMERS4: "posfair.calibration.transformers4",
    FALLBACK: "posfair.calibration.fallback",
}
#: the transformers module whose import registers posfair's attention functions (the registry route)
REGISTRY_MODULE = "transformers.modeling_utils"
_MODELS = "transformers.models."


@dataclass(frozen=True)
class Backend:
    """One architecture (or several that behave alike): how posfair reaches its attention on each stack."""

    model_types: tuple[str, ...]  # config.model_type values; () for DEFAULT
    readme: str  # the first cell of its row in the README's support table
    on_5: str  # the route through posfair's model class (load_model) on transformers 5.x
    on_4: str  # ... on transformers 4.x
    remote_code: bool = False  # a row for remote code declaring these model types (its own modelling code)
    flag_free: bool = False  # calibrated folders load calibrated with plain SentenceTransformer(path), both stacks
    modelling: str | None = None  # the modelling module under transformers.models (the 4.x table's home)
    table_4: tuple[str, str] | None = None  # (table name, "class" | "function") in ``modelling`` on 4.x

    def route(self, transformers_5: bool) -> str:
        """The route through posfair's model class on the given stack."""
        return self.on_5 if transformers_5 else self.on_4

    def plain_route(self, transformers_5: bool) -> str | None:
        """The route of a calibrated folder loaded with plain ``SentenceTransformer(path)`` (None: such a
        folder names posfair's module class and loads through it, the route of :meth:`route`)."""
        if not self.flag_free:
            return None
        return REGISTRY if transformers_5 or self.table_4 is None else TRANSFORMERS4

    @property
    def module(self) -> str | None:
        """The full name of :attr:`modelling`."""
        return None if self.modelling is None else _MODELS + self.modelling


def _bert_family(model_type: str, readme: str, modelling: str, table: str, kind: str = "class") -> Backend:
    # 5.x: the registry; 4.x: the architecture picks its SDPA / eager class itself (fallback), and a
    # calibrated folder loads through posfair's entry in that class table
    return Backend(
        (model_type,), readme, REGISTRY, FALLBACK, flag_free=True, modelling=modelling, table_4=(table, kind)
    )


BACKENDS: tuple[Backend, ...] = (
    _bert_family("bert", "all-MiniLM-L6-v2, BERT", "bert.modeling_bert", "BERT_SELF_ATTENTION_CLASSES"),
    _bert_family("roberta", "RoBERTa", "roberta.modeling_roberta", "ROBERTA_SELF_ATTENTION_CLASSES"),
    _bert_family(
        "xlm-roberta", "bge-m3 (XLM-RoBERTa)", "xlm_roberta.modeling_xlm_roberta", "XLM_ROBERTA_SELF_ATTENTION_CLASSES"
    ),
    _bert_family(
        "modernbert", "ModernBERT", "modernbert.modeling_modernbert", "MODERNBERT_ATTENTION_FUNCTION", "function"
    ),
    Backend(("qwen3",), "Qwen3-Embedding (Qwen3)", REGISTRY, REGISTRY, flag_free=True),
    Backend(
        ("qwen2", "llama", "mistral", "gemma", "gemma3_text", "phi3"),
        "Qwen2, Llama, Mistral, Gemma, Gemma 3, Phi-3",
        REGISTRY,
        REGISTRY,
        flag_free=True,
    ),
    # Gemma 2 soft-caps its attention scores: transformers 5.x refuses any implementation named "*sdpa*" for it,
    # posfair's included, and on 4.x, which lets it switch, posfair's registry kernels refuse the soft-cap; the
    # softmax of its eager attention (after the soft-cap) is intercepted instead.  Not flag-free
    Backend(("gemma2",), "Gemma 2", FALLBACK, FALLBACK),
    # remote code: the published modelling code computes its attention itself
    Backend(
        ("new",),
        "gte-multilingual-base (remote code `NewAttention` / `NewSdpaAttention`)",
        FALLBACK,
        FALLBACK,
        remote_code=True,
    ),
    Backend(
        ("xlm-roberta",),
        "jina-embeddings-v3 (remote code, packed QKV + SDPA)",
        FALLBACK,
        FALLBACK,
        remote_code=True,
    ),
)
#: any other architecture, remote code included
DEFAULT = Backend((), "any other architecture (remote code included)", PROBE, PROBE)


def backend_for(model_type: str | None, remote_code: bool = False) -> Backend:
    """The row of ``model_type`` (remote code: a model whose class is not transformers' own); :data:`DEFAULT` if none."""
    for row in BACKENDS:
        if row.remote_code == remote_code and model_type in row.model_types:
            return row
    return DEFAULT


def attention_tables() -> dict[str, tuple[str, str]]:
    """modelling module -> (its 4.x attention table, "class" | "function"): the tables posfair extends on 4.x."""
    return {row.module: row.table_4 for row in BACKENDS if row.table_4 is not None}


def import_hooks() -> dict[str, str]:
    """transformers module -> the route whose ``on_import(module)`` runs once that module is imported.

    The registry registers when ``transformers.modeling_utils`` is imported; each 4.x attention table
    is extended when its modelling module is -- hooked from ``import posfair`` on, before anything
    imports them (a modelling module imports ``modeling_utils`` while it is itself being imported, so a
    hook added from the registration would come too late for it).  On transformers 5.x, where those
    tables are gone, their hooks find nothing to extend."""
    return {REGISTRY_MODULE: REGISTRY, **{module: TRANSFORMERS4 for module in attention_tables()}}


def _on_import(route: str) -> Callable[[object], None]:
    def run(module: object) -> None:
        importing = sys.modules.get(ROUTE_MODULES[route])
        if importing is not None and not hasattr(importing, "on_import"):
            # the route's own module imported transformers' modelling code (``import posfair.calibration.registry``
            # before anything else): it is not complete yet, and runs its hook itself when it is
            return
        importlib.import_module(ROUTE_MODULES[route]).on_import(module)

    run.__qualname__ = f"on_import[{route}]"
    return run


def install_import_hooks(when_imported: Callable[[str, Callable[[object], None]], None]) -> None:
    """Arrange (through ``when_imported``, :func:`posfair.runtime.post_import.when_imported`) for every hook of
    :func:`import_hooks` to run once its module is imported (at once if it already is)."""
    for module, route in import_hooks().items():
        when_imported(module, _on_import(route))
