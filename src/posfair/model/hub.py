"""Where a model comes from, checked in a moment: a local folder, the Hugging Face cache, or the hub.

:func:`check_model_source` runs before a model is loaded.  A name that is neither
a local folder nor in the local Hugging Face cache is refused at once when the
hub cannot be used: immediately when ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``
is set, else after one probe of the hub with a short timeout and no retries
(instead of the minute of retries a download would spend).  Imports only the
standard library at module level, so the command line's checks stay fast.
"""

from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

from posfair.runtime.errors import PosfairInputError

__all__ = ["ModelNotFound", "check_model_source", "hub_offline", "probe_hub", "PROBE_TIMEOUT"]

#: seconds the one probe of the hub may take (connection and name lookup included)
PROBE_TIMEOUT = 4.0
_TRUE = {"1", "ON", "YES", "TRUE"}
_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
# files one of which every loadable model folder holds (sentence-transformers, transformers, a PEFT adapter)
_MODEL_FILES = ("modules.json", "config.json", "adapter_config.json")


#: what a refusal of an unreachable hub id offers instead: the models that run offline
OFFLINE_MODELS = "offline, use 'bundled' (all-MiniLM-L6-v2) or 'bundled:multilingual-e5-small'"


class ModelNotFound(PosfairInputError, FileNotFoundError):
    """A model name that names no local folder and no model that can be fetched now.

    ``name`` is the name as given, ``reason`` what was found (e.g. ``not a local
    folder, not in the Hugging Face cache, and HF_HUB_OFFLINE is set``).  A
    ``ValueError`` (:class:`~posfair.runtime.errors.PosfairInputError`) and an ``OSError``
    (``FileNotFoundError``), so callers catching either keep working.
    """

    def __init__(self, name: str, reason: str, *, local: bool = False):
        self.name = name
        self.reason = reason
        message = f"model path {name!r} does not exist" if local else f"cannot load model {name!r}: {reason}"
        super().__init__(message)


def hub_offline() -> str | None:
    """The environment variable that puts the hub offline (``HF_HUB_OFFLINE=1``...), or None."""
    return next((v for v in _OFFLINE_VARS if os.environ.get(v, "").strip().upper() in _TRUE), None)


def _endpoint() -> str:
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        try:
            from huggingface_hub import constants

            endpoint = constants.ENDPOINT
        except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
            endpoint = "https://huggingface.co"
    return endpoint.rstrip("/")


def probe_hub(timeout: float = PROBE_TIMEOUT) -> str | None:
    """One request to the hub, bounded by ``timeout`` seconds in all: None if it answered, else why not.

    Any HTTP answer (even 404) counts as reachable; the request runs in a daemon
    thread so that a slow name lookup cannot hold the caller past ``timeout``.
    """
    url = f"{_endpoint()}/api/models"
    result: list[str | None] = []

    def probe() -> None:
        try:
            req = urllib.request.Request(url, method="HEAD")
            with urllib.request.urlopen(req, timeout=timeout):
                pass
            result.append(None)
        except urllib.error.HTTPError:  # the hub answered
            result.append(None)
        except Exception as exc:  # URLError, socket timeout, connection refused, ...
            reason = getattr(exc, "reason", None) or exc
            result.append(f"{url}: {reason}")

    thread = threading.Thread(target=probe, name="posfair-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if not result:
        return f"{url}: no answer within {timeout:g} s"
    return result[0]


def _looks_local(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name or name.endswith("/")


def _in_cache(repo_id: str, cache_dir: str | None, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    for filename in _MODEL_FILES:
        try:
            found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
        except Exception:  # not a valid repo id (HFValidationError): cannot be cached
            return False
        if isinstance(found, str):
            return True
    return False


def check_model_source(
    name_or_path: str | os.PathLike,
    *,
    cache_folder: str | None = None,
    revision: str | None = None,
    local_files_only: bool = False,
) -> str:
    """Where ``name_or_path`` would be loaded from: ``"local"``, ``"cache"`` or ``"hub"``.

    Raises :class:`ModelNotFound` for a local-looking path that does not exist, a
    folder without a model (no ``modules.json`` / ``config.json``), and a hub id
    that is not in the Hugging Face cache while the hub is offline or unreachable.
    ``cache_folder``: sentence-transformers' ``cache_folder`` (default:
    ``SENTENCE_TRANSFORMERS_HOME``, else the Hugging Face cache); ``local_files_only``
    refuses what is not local or cached, as ``HF_HUB_OFFLINE`` does.
    """
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.exists():
        if path.is_dir() and not any((path / f).is_file() for f in _MODEL_FILES):
            raise ModelNotFound(name, f"a folder without a model (no {', '.join(_MODEL_FILES)})")
        if not path.is_dir():
            raise ModelNotFound(name, "a file, not a model folder")
        return "local"
    if _looks_local(name):
        raise ModelNotFound(name, "no such folder", local=True)
    cache_dir = cache_folder or os.environ.get("SENTENCE_TRANSFORMERS_HOME") or None
    candidates = [name] if "/" in name else [name, f"sentence-transformers/{name}"]
    if any(_in_cache(c, cache_dir, revision) for c in candidates):
        return "cache"
    offline = "local_files_only" if local_files_only else hub_offline()
    if offline:
        raise ModelNotFound(
            name, f"not a local folder, not in the Hugging Face cache, and {offline} is set; {OFFLINE_MODELS}"
        )
    why = probe_hub()
    if why is not None:
        raise ModelNotFound(
            name,
            f"not a local folder, not in the Hugging Face cache, and the hub is unreachable ({why}); {OFFLINE_MODELS}",
        )
    return "hub"
