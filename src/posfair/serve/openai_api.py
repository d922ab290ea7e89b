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
  one non-empty string), joined by :func:`posfair.model.token_spans.join_segments`.

Every refusal is an :class:`ApiError`: an HTTP status and the OpenAI error body
``{"error": {"message", "type", "param", "code"}}``.  No message quotes a text of the request.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import unicodedata
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_INPUTS",
    "ApiError",
    "EmbeddingRequest",
    "EmbeddingsBody",
    "embedding_response",
    "key_digest",
    "models_response",
    "parse_request",
]

#: inputs one request may hold (OpenAI's own limit)
MAX_INPUTS = 2048
#: largest request body accepted (413 above): 2048 inputs of ~4 KiB each
MAX_BODY_BYTES = 8 * 1024 * 1024
#: characters one text may hold (a text is refused before it is tokenised): 64 KiB, far over any model's token limit
MAX_TEXT_CHARS = 65536
#: the longest ``model``, ``user`` and ``prompt_name``
MAX_NAME_CHARS = 256
#: the longest ``calibration`` spec
MAX_CALIBRATION_CHARS = 256
#: the largest basket a request's calibration may ask for (a model reads far fewer tokens)
MAX_BASKET = 1_000_000
#: the largest ``dimensions`` read (the replica then takes only the model's own width)
MAX_DIMENSIONS = 65536
#: the posfair fields of a request, beside OpenAI's
KNOWN_FIELDS = {"model", "input", "encoding_format", "user", "dimensions", "calibration", "prompt_name", "normalize"}


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
    dimensions: int | None = None  # None, or checked by the replica: the model's own width only
    normalize: bool = True  # /v1/segments: each segment vector of unit length (False: the plain mean of token states)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class EmbeddingsBody(BaseModel):
    """The JSON body of ``POST /v1/embeddings`` and ``POST /v1/segments``, typed: every field bounded, no other
    field (``extra="forbid"``), no coercion (``strict``).  Each field's check raises :class:`ApiError` with the
    message a client reads; :func:`parse_request` turns what is left of pydantic's errors into one."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    model: Annotated[str, Field(max_length=MAX_NAME_CHARS)]
    input: str | Annotated[list[str], Field(min_length=1, max_length=MAX_INPUTS)]
    encoding_format: Literal["float", "base64"] | None = None
    user: Annotated[str, Field(max_length=MAX_NAME_CHARS)] | None = None
    dimensions: Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)] | None = None
    calibration: Annotated[str, Field(max_length=MAX_CALIBRATION_CHARS)] | None = None
    prompt_name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)] | None = None
    normalize: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _an_object_of_known_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise bad(f"the request body must be a JSON object; got {_kind(data)}")
        unknown = sorted(set(data) - KNOWN_FIELDS)
        if unknown:
            raise bad(
                f"unknown field(s) {', '.join(map(_name, unknown))}; known: {', '.join(sorted(KNOWN_FIELDS))}",
                _name(unknown[0]),
            )
        if not isinstance(data.get("model"), str):
            raise bad(f"'model' must be a string (the served model); got {_kind(data.get('model'))}", "model")
        return data

    @field_validator("input", mode="before")
    @classmethod
    def _texts(cls, value: Any, info: ValidationInfo) -> Any:
        return _texts(value, bool((info.context or {}).get("segments")))

    @field_validator("model", "user", mode="before")
    @classmethod
    def _a_name(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and not isinstance(value, str):
            raise bad(f"{info.field_name!r} must be a string; got {_kind(value)}", info.field_name)
        if value is not None and (len(value) > MAX_NAME_CHARS or not _unicode(value)):
            raise bad(
                f"{info.field_name!r} must be at most {MAX_NAME_CHARS} characters of valid Unicode", info.field_name
            )
        return value

    @field_validator("encoding_format", mode="before")
    @classmethod
    def _a_format(cls, value: Any) -> Any:
        if value not in (None, "float", "base64"):
            raise bad(f"'encoding_format' must be 'float' or 'base64'; got {_show(value)}", "encoding_format")
        return value

    @field_validator("dimensions", mode="before")
    @classmethod
    def _a_width(cls, value: Any) -> Any:
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_DIMENSIONS
        ):
            raise bad(
                f"'dimensions' must be a whole number from 1 to {MAX_DIMENSIONS} (the model's own width); "
                f"got {_show(value)}",
                "dimensions",
            )
        return value

    @field_validator("calibration", mode="before")
    @classmethod
    def _a_calibration(cls, value: Any) -> Any:
        return None if value is None else request_calibration(value)

    @field_validator("prompt_name", mode="before")
    @classmethod
    def _a_prompt(cls, value: Any) -> Any:
        if value is not None and (
            not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS or not _unicode(value)
        ):
            raise bad(
                f"'prompt_name' must be the name of one of the model's prompts; got {_show(value)}", "prompt_name"
            )
        return value


def request_calibration(value: Any) -> str:
    """A request's ``calibration`` field checked without reading anything: ``stock``, ``default``, a spec
    ``B,LAYERS,STRENGTH[,NAME=VALUE]`` or a label as tables print it (``B128-L0.5-a0.5``), in printable ASCII (no
    tab, line break or other white space that :meth:`Calibration.parse` would strip around a name), at most
    :data:`MAX_CALIBRATION_CHARS` characters, naming no ``prior=`` nor a label's ``-prior`` (a request reads no
    file) and no basket over :data:`MAX_BASKET` tokens.  The spec itself is parsed by the replica
    (:meth:`posfair.serve.engine.Engine.calibration_for`), after this check."""
    what = "'calibration' must be 'stock', 'default', a spec B,LAYERS,STRENGTH or a label B128-L0.5-a0.5"
    if not isinstance(value, str) or not value.strip():
        raise bad(f"{what}; got {_show(value)}", "calibration")
    if len(value) > MAX_CALIBRATION_CHARS or not value.isascii() or not value.isprintable():
        raise bad(f"{what}, in at most {MAX_CALIBRATION_CHARS} printable ASCII characters", "calibration")
    parts = [p.partition("=") for p in value.split(",")]
    if any(sep and name.strip().lower() == "prior" for name, sep, _ in parts):
        raise bad("'calibration' cannot name a prior file (prior=FILE): a request reads no file", "calibration")
    basket = parts[0][0].strip()
    label = re.match(r"B(\d+)-", basket)  # a label as tables print it (B128-L0.5-a0.5)
    if label is not None and re.search(r"-prior(?![^-])|-prior\d", basket):
        raise bad(
            "'calibration' cannot name a positional prior (a label's -prior): a request reads no file", "calibration"
        )
    if label is not None:
        basket = label.group(1)
    elif len(parts) < 3:
        basket = ""
    if basket.isdigit() and (len(basket) > 9 or int(basket) > MAX_BASKET):
        raise bad(f"'calibration': the basket size must be at most {MAX_BASKET} tokens", "calibration")
    return value.strip()


def parse_request(body: bytes, served_name: str, *, segments: bool = False) -> EmbeddingRequest:
    """The request in ``body`` (JSON bytes) checked by :class:`EmbeddingsBody`; :class:`ApiError` (400, 404)
    otherwise -- also for JSON nested too deep or a number too long to read."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(
            f"the request body is not valid JSON ({type(exc).__name__} at position {getattr(exc, 'pos', 0)})"
        ) from None
    except RecursionError:
        raise bad("the request body is nested too deeply") from None
    except ValueError:  # an integer of more digits than Python reads (sys.get_int_max_str_digits)
        raise bad("the request body holds a number too long to read") from None
    try:
        req = EmbeddingsBody.model_validate(data, context={"segments": segments})
    except ValidationError as exc:  # what no field check above answered: name the first field
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else None
        raise bad(f"{field!r}: {first['msg']}" if field else first["msg"], field) from None
    if req.model != served_name:
        raise ApiError(
            404,
            f"the model {req.model!r} is not served here; this server serves {served_name!r} (GET /v1/models)",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    texts = (req.input,) if isinstance(req.input, str) else tuple(req.input)
    if req.normalize is not None and not segments:
        raise bad("'normalize' applies to /v1/segments only (/v1/embeddings vectors are the model's own)", "normalize")
    normalize = True if req.normalize is None else req.normalize
    return EmbeddingRequest(
        texts, req.encoding_format or "float", req.calibration, req.prompt_name, req.dimensions, normalize
    )


def _texts(value: Any, segments: bool) -> list[str] | str:
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
        if len(t) > MAX_TEXT_CHARS:
            raise bad(f"input {i} has {len(t)} characters; at most {MAX_TEXT_CHARS} per text", "input")
        if not _unicode(t):
            raise bad(f"input {i} is not valid Unicode (it holds a lone surrogate)", "input")
        if _blank(t):
            raise bad(
                f"input {i} is empty or only white space or control characters: posfair does not embed empty texts",
                "input",
            )
    return value


def _unicode(text: str) -> bool:
    """Whether ``text`` is valid Unicode (no lone surrogate, which JSON's ``\\ud800`` escapes can carry)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _blank(text: str) -> bool:
    """Only white space and control or format characters (U+0000, U+200B, ...): nothing a model reads as a text."""
    return all(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in text)


def _name(field: Any) -> str:
    """A field name from a request, as a message shows it (short, printable)."""
    text = str(field)
    return text if len(text) <= 40 and text.isprintable() and _unicode(text) else "(a field)"


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


def key_digest(key: str) -> str:
    """What the gateway keeps of the API key (its SHA-256): the key itself travels to no replica."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


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
