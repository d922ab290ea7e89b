"""The HTTP protocol of ``posfair serve``, without Ray or a model: requests checked, answers shaped.

What a request may be is decided here, before any replica sees it:

* ``POST /v1/embeddings``: the OpenAI embeddings request -- ``model`` (the served name), ``input``
  (a string or a list of at most :data:`MAX_INPUTS` non-empty strings), ``encoding_format``
  (``float`` or ``base64``: little-endian float32, as the official client decodes it), ``user`` and
  ``dimensions`` (accepted only as the model's own width); posfair's own fields ``calibration``
  (``"stock"``, ``"default"`` or a spec ``B,LAYERS,STRENGTH[,VARIANT=VALUE]``; only the server's own
  unless it allows per-request calibrations; never ``prior=FILE``: a request reads no file) and
  ``prompt_name`` (one of the model's prompts, e.g. ``query`` / ``passage`` for e5).
* ``POST /v1/segments``: the same fields, ``input`` being one document as its segments (at least
  one non-empty string), joined by :func:`posfair.spans.join_segments`.

Every refusal is an :class:`ApiError`: an HTTP status and the OpenAI error body
``{"error": {"message", "type", "param", "code"}}``.  No message quotes a text of the request.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import numpy as np

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_INPUTS",
    "ApiError",
    "EmbeddingRequest",
    "embedding_response",
    "models_response",
    "parse_request",
]

#: inputs one request may hold (OpenAI's own limit)
MAX_INPUTS = 2048
#: largest request body accepted (413 above): 2048 inputs of ~4 KiB each
MAX_BODY_BYTES = 8 * 1024 * 1024
#: the posfair fields of a request, beside OpenAI's
KNOWN_FIELDS = {"model", "input", "encoding_format", "user", "dimensions", "calibration", "prompt_name"}


@dataclasses.dataclass
class ApiError(Exception):
    """A refused request: its HTTP status and the OpenAI error body."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


@dataclasses.dataclass(frozen=True)
class EmbeddingRequest:
    """A checked request: the texts (or a document's segments), how to encode them, how to answer."""

    texts: tuple[str, ...]
    encoding_format: str = "float"
    calibration: str | None = None  # None: the server's; else "stock", "default" or a spec (checked by the replica)
    prompt_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_request(body: bytes, served_name: str, *, segments: bool = False) -> EmbeddingRequest:
    """The request in ``body`` (JSON bytes), checked; :class:`ApiError` (400, 404) otherwise."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(
            f"the request body is not valid JSON ({type(exc).__name__} at position {getattr(exc, 'pos', 0)})"
        ) from None
    if not isinstance(data, dict):
        raise bad(f"the request body must be a JSON object; got {_kind(data)}")
    unknown = sorted(set(data) - KNOWN_FIELDS)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(KNOWN_FIELDS))}", unknown[0])
    model = data.get("model")
    if not isinstance(model, str):
        raise bad(f"'model' must be a string (the served model, {served_name!r}); got {_kind(model)}", "model")
    if model != served_name:
        raise ApiError(
            404,
            f"the model {model!r} is not served here; this server serves {served_name!r} (GET /v1/models)",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    texts = _texts(data.get("input"), segments)
    fmt = data.get("encoding_format", "float")
    if fmt is None:
        fmt = "float"
    if fmt not in ("float", "base64"):
        raise bad(f"'encoding_format' must be 'float' or 'base64'; got {_show(fmt)}", "encoding_format")
    if data.get("user") is not None and not isinstance(data["user"], str):
        raise bad(f"'user' must be a string; got {_kind(data['user'])}", "user")
    dims = data.get("dimensions")
    if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
        raise bad(f"'dimensions' must be a whole number >= 1; got {_show(dims)}", "dimensions")
    cal = data.get("calibration")
    if cal is not None:
        if not isinstance(cal, str) or not cal.strip():
            raise bad(
                f"'calibration' must be 'stock', 'default' or a spec B,LAYERS,STRENGTH; got {_show(cal)}", "calibration"
            )
        if "prior=" in cal.replace(" ", ""):
            raise bad("'calibration' cannot name a prior file (prior=FILE): a request reads no file", "calibration")
    prompt = data.get("prompt_name")
    if prompt is not None and (not isinstance(prompt, str) or not prompt):
        raise bad(f"'prompt_name' must be the name of one of the model's prompts; got {_show(prompt)}", "prompt_name")
    return EmbeddingRequest(tuple(texts), fmt, cal.strip() if cal else None, prompt)


def _texts(value: Any, segments: bool) -> list[str]:
    what = "segments" if segments else "inputs"
    if isinstance(value, str) and not segments:
        value = [value]
    if not isinstance(value, list):
        want = "a list of strings (the document's segments)" if segments else "a string or a list of strings"
        raise bad(f"'input' must be {want}; got {_kind(value)}", "input")
    if not value:
        raise bad(f"'input' is empty: give at least one text ({what})", "input")
    if len(value) > MAX_INPUTS:
        raise bad(f"'input' holds {len(value)} {what}; at most {MAX_INPUTS} per request", "input")
    for i, t in enumerate(value):
        if not isinstance(t, str):
            # token ids (lists of ints), which OpenAI's API also takes, are not: posfair embeds texts
            raise bad(f"input {i} is {_kind(t)}, not a string: posfair embeds texts (not token ids)", "input")
        if not t.strip():
            raise bad(f"input {i} is empty or only white space: posfair does not embed empty texts", "input")
    return value


def _kind(value: Any) -> str:
    """A JSON value's type, as a message names it (never the value: it may be a user's text)."""
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A short option value in a message (a long one is only named by its type)."""
    text = json.dumps(value)
    return text if len(text) <= 40 else _kind(value)


def encode_vector(vector: np.ndarray, fmt: str) -> list[float] | str:
    v = np.asarray(vector, dtype="<f4")
    return base64.b64encode(v.tobytes()).decode("ascii") if fmt == "base64" else v.tolist()


def embedding_response(vectors: np.ndarray, fmt: str, served_name: str, prompt_tokens: int) -> dict[str, Any]:
    """The OpenAI embeddings answer: one ``embedding`` object per vector, ``index`` its position."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, fmt)} for i, v in enumerate(vectors)
        ],
        "model": served_name,
        "usage": {"prompt_tokens": int(prompt_tokens), "total_tokens": int(prompt_tokens)},
    }


def models_response(served_name: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": served_name, "object": "model", "created": int(created), "owned_by": "posfair"}],
    }
