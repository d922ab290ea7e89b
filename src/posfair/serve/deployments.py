"""The two Ray Serve deployments of ``posfair serve`` (imported only when a server starts: needs ``ray[serve]``).

* :class:`Gateway` -- the HTTP ingress (FastAPI), no model, no CPU reserved: the API key, the body
  size, the JSON and its fields (:func:`posfair.serve.openai_api.parse_request`), the served model's
  name; then one call to the encoder deployment per request.  Until the encoder application has run
  (its replicas loaded the model: the gateway asks Serve's controller, at most every
  :data:`_STATUS_PERIOD_S`), ``/health`` and every API call answer 503 in the OpenAI error shape.  A
  replica that died under a request (or none being up while Serve replaces it) is a 503, never a wrong
  vector.
* :class:`Encoder` -- the model replicas (``--replicas``), each holding its share of the CPUs or
  one GPU (:func:`posfair.distributed.ray_engine.plan_workers`).  Requests reach it through
  ``@serve.batch``: ``/v1/embeddings`` requests arriving together are answered by one
  :meth:`posfair.serve.engine.Engine.embed_many`, ``/v1/segments`` requests (each document tokenised
  first: its token count is its size, a batch's total at most ``--max-batch-tokens``) by one
  :meth:`posfair.serve.engine.Engine.segments_many` -- shared, length-sorted, token-budget forward passes.

They live in two Serve applications: the gateway's (route ``/``) is deployed first and needs no model,
so the server answers (503) within seconds; the encoder's, deployed next, has no route of its own.
"""

# no "from __future__ import annotations": FastAPI reads the handlers' annotations (Request) at run time

import asyncio
import hashlib
import hmac
import logging
import time
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from posfair.distributed.spec import EmbedSpec
from posfair.serve.engine import Answer, Document, Engine
from posfair.serve.openai_api import (
    MAX_BODY_BYTES,
    MAX_INPUTS,
    ApiError,
    EmbeddingRequest,
    embedding_response,
    models_response,
    parse_request,
)

__all__ = [
    "BATCH_HEADER",
    "ENCODER",
    "ENCODER_APP",
    "GATEWAY_APP",
    "PASSES_HEADER",
    "TRUNCATED_HEADER",
    "Encoder",
    "Gateway",
    "encoder_running",
]

GATEWAY_APP = "posfair"
ENCODER_APP = "posfair-encoder"
ENCODER = "PosfairEncoder"
#: the response header saying how many inputs were truncated to the token limit (``--truncate``)
TRUNCATED_HEADER = "X-Posfair-Truncated"
#: /v1/segments answers: the requests the replica answered in the same batch as this one (this one included) ...
BATCH_HEADER = "X-Posfair-Batch-Requests"
#: ... and the forward passes that batch took
PASSES_HEADER = "X-Posfair-Forward-Passes"
#: how often (at most) a gateway asks Serve's controller whether the model replicas are up, until they are
_STATUS_PERIOD_S = 0.25
#: the longest /health waits for a replica's answer
_HEALTH_TIMEOUT_S = 2.0

logger = logging.getLogger("posfair.serve")

api = FastAPI(title="posfair serve", docs_url=None, redoc_url=None, openapi_url=None)


def _error(err: ApiError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return _error(ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code))


@api.exception_handler(RequestValidationError)
async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return _error(ApiError(400, "the request does not fit the API"))


def _unavailable(why: str) -> ApiError:
    return ApiError(503, why, "server_error", None, "service_unavailable")


_LOADING = _unavailable("the model is loading; retry when GET /health answers 200")
_RETRY = {"Retry-After": "1"}


def encoder_running() -> bool:
    """Whether the encoder application runs (every replica has loaded the model), as Serve's controller says."""
    app = serve.status().applications.get(ENCODER_APP)
    return app is not None and app.status == "RUNNING"


def key_digest(key: str) -> str:
    """What the gateway keeps of the API key (its SHA-256): the key itself travels to no replica."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@serve.deployment(
    name="PosfairGateway",
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1024,
    health_check_period_s=2,
)
@serve.ingress(api)
class Gateway:
    """The HTTP side (see the module's description)."""

    def __init__(self, served_name: str, key_sha256: str | None, created: int):
        self.served_name, self.key_sha256, self.created = served_name, key_sha256, created
        self._handle = None
        self._loaded = False  # the encoder application has run since this gateway started
        self._asked = -_STATUS_PERIOD_S  # when the controller was last asked (time.monotonic())

    async def _loading(self) -> bool:
        """Whether the model replicas have not come up yet (at the server's start; once they have, a replica
        that dies is replaced by Serve, and a request it was serving gets 503 from :meth:`_call`)."""
        if not self._loaded and time.monotonic() - self._asked >= _STATUS_PERIOD_S:
            self._asked = time.monotonic()
            try:
                self._loaded = await asyncio.to_thread(encoder_running)
            except Exception:  # noqa: BLE001 -- the controller not answering: not known to be loaded
                logger.warning("could not ask Serve's controller whether the model replicas run", exc_info=True)
        return not self._loaded

    def _encoder(self):
        if self._handle is None:
            self._handle = serve.get_deployment_handle(ENCODER, app_name=ENCODER_APP)
        return self._handle

    def _check_key(self, request: Request) -> None:
        if self.key_sha256 is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, key = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key_digest(key.strip()), self.key_sha256):
            raise ApiError(
                401,
                "a valid API key is needed: send 'Authorization: Bearer KEY'",
                "invalid_request_error",
                None,
                "invalid_api_key",
            )

    async def _body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        too_big = ApiError(413, f"the request body is over {MAX_BODY_BYTES} bytes", code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise too_big
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise too_big
        return bytes(body)

    async def _call(self, method: str, req: EmbeddingRequest) -> Answer:
        from ray.exceptions import ActorUnavailableError, RayActorError

        try:
            return await getattr(self._encoder(), method).remote(req)
        except (RayActorError, ActorUnavailableError, serve.exceptions.DeploymentUnavailableError) as exc:
            logger.warning("an encoder replica failed under a request: %s", type(exc).__name__)
            raise _unavailable("the model replica serving this request stopped; retry") from None
        except serve.exceptions.BackPressureError:
            raise _unavailable("the server is overloaded; retry") from None

    async def _answer(self, request: Request, segments: bool) -> JSONResponse:
        try:
            self._check_key(request)
            req = parse_request(await self._body(request), self.served_name, segments=segments)
            if await self._loading():
                return _error(_LOADING, _RETRY)
            answer = await self._call("segments" if segments else "embed", req)
        except ApiError as err:
            return _error(err)
        if answer.error is not None:
            return JSONResponse(answer.error, status_code=answer.status)
        headers = {TRUNCATED_HEADER: str(answer.truncated)} if answer.truncated else {}
        if segments:
            headers |= {BATCH_HEADER: str(answer.batch_requests), PASSES_HEADER: str(answer.forward_passes)}
        body = embedding_response(answer.vectors, req.encoding_format, self.served_name, answer.tokens)
        return JSONResponse(body, headers=headers or None)

    @api.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> JSONResponse:
        return await self._answer(request, segments=False)

    @api.post("/v1/segments")
    async def segments(self, request: Request) -> JSONResponse:
        return await self._answer(request, segments=True)

    @api.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        try:
            self._check_key(request)
        except ApiError as err:
            return _error(err)
        if await self._loading():
            return _error(_LOADING, _RETRY)
        return JSONResponse(models_response(self.served_name, self.created))

    @api.get("/health")
    async def health(self) -> JSONResponse:
        if await self._loading():
            return _error(_LOADING, _RETRY)
        try:
            await asyncio.wait_for(self._encoder().ready.remote(), _HEALTH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 -- not deployed yet, loading, replaced: not ready
            return _error(_unavailable("the model is not loaded (yet)"))
        return JSONResponse({"status": "ok", "model": self.served_name})


def _texts_in(requests: list[EmbeddingRequest]) -> int:
    return sum(len(r.texts) for r in requests)


def _tokens_in(docs: list[Document]) -> int:
    return sum(d.size for d in docs)


@serve.deployment(
    name=ENCODER,
    max_ongoing_requests=64,
    health_check_period_s=2,
    health_check_timeout_s=60,
    graceful_shutdown_timeout_s=5,
)
class Encoder:
    """A model replica (see the module's description); ``settings`` as :func:`posfair.serve.runner.encoder_settings`."""

    def __init__(self, settings: dict[str, Any]):
        if settings.get("threads"):
            torch.set_num_threads(int(settings["threads"]))
        spec = EmbedSpec.from_dict(settings["spec"])
        model = spec.load_model(settings.get("device"))
        if model.fingerprint != settings["fingerprint"]:
            raise RuntimeError(
                f"replica model fingerprint {model.fingerprint} differs from the one the server checked "
                f"({settings['fingerprint']}): install the same model files and library versions on every node"
            )
        self.engine = Engine(
            model, spec, truncate=settings["truncate"], request_calibration=settings["request_calibration"]
        )
        self._segments_batch.set_max_batch_size(spec.max_tokens)  # a batch of documents: --max-batch-tokens
        self.started = time.time()

    def ready(self) -> bool:
        return True

    @serve.batch(max_batch_size=MAX_INPUTS, batch_wait_timeout_s=0.005, batch_size_fn=_texts_in)
    async def embed(self, requests: list[EmbeddingRequest]) -> list[Answer]:
        return await asyncio.to_thread(self.engine.embed_many, requests)

    async def segments(self, request: EmbeddingRequest) -> Answer:
        try:
            doc = await asyncio.to_thread(self.engine.document, request)
        except ApiError as err:
            return Answer.refused(err)
        except Exception as exc:  # noqa: BLE001 -- this request's own failure, answered in OpenAI's shape
            logger.warning("a /v1/segments request failed in the model replica: %s", type(exc).__name__)
            return Answer.refused(ApiError(500, "the model could not encode this request", "server_error"))
        return await self._segments_batch(doc)

    # max_batch_size is set per replica (__init__); a document is never over it (Document.size)
    @serve.batch(max_batch_size=16384, batch_wait_timeout_s=0.005, batch_size_fn=_tokens_in)
    async def _segments_batch(self, docs: list[Document]) -> list[Answer]:
        return await asyncio.to_thread(self.engine.segments_many, docs)
