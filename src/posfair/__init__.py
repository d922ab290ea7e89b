"""posfair: measure and repair positional bias in text-embedding models.

Importing posfair is light (no torch, no transformers); it arranges for posfair's
attention functions to be registered with transformers as soon as transformers'
modelling code is imported, so a calibrated folder saved by posfair loads calibrated
with plain ``SentenceTransformer(path)`` or ``AutoModel.from_pretrained(path)``.
"""

from posfair import _post_import

__version__ = "0.1.0"

__all__ = ["Calibration", "FairModel", "load_model", "__version__"]


def __getattr__(name):  # lazy: importing posfair (e.g. for ``posfair --help``) must not import numpy, torch or transformers
    if name == "Calibration":
        from posfair.calibration import Calibration

        return Calibration
    if name in ("FairModel", "load_model"):
        from posfair import model

        return getattr(model, name)
    raise AttributeError(f"module 'posfair' has no attribute {name!r}")


def _register_attention(_module) -> None:
    from posfair.calibration.registry import register

    register()


def _extend_attention_table(module) -> None:  # transformers 4.x only (posfair.calibration.transformers4)
    from posfair.calibration import transformers4

    transformers4.extend(module)


_post_import.when_imported("transformers.modeling_utils", _register_attention)
# hooked here, before anything imports them: a modelling module imports transformers.modeling_utils while it
# is itself being imported, so a hook added from _register_attention would come too late for it
for _name in ("bert.modeling_bert", "roberta.modeling_roberta", "xlm_roberta.modeling_xlm_roberta", "modernbert.modeling_modernbert"):
    _post_import.when_imported(f"transformers.models.{_name}", _extend_attention_table)
del _name
