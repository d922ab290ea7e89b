"""The Ray Serve deployments of ``posfair serve``, composed into one application by :func:`posfair.serve.app.app`
(``Gateway.bind(Encoder.bind(...))``; imported only where a server starts: needs ``ray[serve]``).

* :class:`Gateway` -- the HTTP ingress (FastAPI), no model, no CPU reserved: the API key, the content type,
  the body size, the typed request (:func:`posfair.serve.openai_api.parse_request`), the served model's name;
  then the encoder deployment's handle (given to it by the composition).  Whether the model replicas are up is
  asked of that handle (:meth:`Encoder.info`, shared by the requests arriving meanwhile, waited for at most
  :data:`READY_WAIT_S`): while they are not -- the model loading, a replica being replaced, or none able to
  start -- ``/health`` and every API call answer 503 in OpenAI's error shape at once, never a hang.  A
  request is answered within ``request_timeout_s`` (408 past it); a long one is sent to the replicas in parts
  of at most :data:`PART_TEXTS` texts, one part at a time, so requests arriving meanwhile are batched between
  its parts, not behind all of it, and a client's long requests take turns (:mod:`posfair.serve.sharing`: at
  most one part per replica in flight per client, however many long requests it sends).  The gateway holds at
  most ``max_queued_requests`` API requests at once (:data:`QUEUED_PER_REPLICA` per replica by default): one more
  gets 503 with ``Retry-After`` at once, never a queue whose every request waits longer as it grows.  ``/health``
  asks the replicas nothing while they answered within :data:`HEALTH_FRESH_S`, and otherwise one question for all
  the ``/health`` requests arriving meanwhile, so it stays 200 under load.  Once the server is stopping (:meth:`Gateway.drain`) every new request gets
  503 ("stopping") while those in flight finish.
* :class:`Encoder` -- the model replicas (``replicas``), each holding its share of the CPUs or one GPU
  (:func:`posfair.distributed.ray_engine.plan_workers`).  Requests reach it through ``@serve.batch``:
  ``/v1/embeddings`` requests arriving together are answered by one
  :meth:`posfair.serve.engine.Engine.embed_many` (the parts of long requests in a queue of their own, so a short
  request waits for at most the part being encoded), ``/v1/segments`` requests (each document tokenised first: its
  token count is its size, a batch's total at most ``max_batch_tokens``) by one
  :meth:`posfair.serve.engine.Engine.segments_many` -- shared, length-sorted, token-budget forward passes, a
  failure answered only to the request that causes it.  Serve's health check (:meth:`Encoder.check_health`)
  fails a replica whose forward passes fail whatever the request; Serve then replaces it.
"""

# no "from __future__ import annotations": FastAPI reads the handlers' annotations (Request) at run time

import asyncio
import hmac
import logging
import re
import time
from typing import Any

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from posfair.distributed.ray_engine import held_threads
from posfair.distributed.spec import EmbedSpec
from posfair.runtime.private_api import replica_grpc_on_loopback
from posfair.serve.engine import Answer, Document, Engine
from posfair.serve.openai_api import (
    MAX_BODY_BYTES,
    ApiError,
    EmbeddingRequest,
    embedding_response,
    key_digest,
    models_response,
    parse_request,
)
from posfair.serve.sharing import FairShare

__all__ = [
    "APP",
    "BATCH_HEADER",
    "ENCODER",
    "GATEWAY",
    "PASSES_HEADER",
    "SHORT_HEADER",
    "TRUNCATED_HEADER",
    "Encoder",
    "Gateway",
    "key_digest",
]

#: the one Serve application of a posfair server, and its deployments
APP = "posfair"
GATEWAY = "PosfairGateway"
ENCODER = "PosfairEncoder"
#: the response header saying how many inputs were truncated to the token limit (``--truncate``)
TRUNCATED_HEADER = "X-Posfair-Truncated"
#: ... and how many a calibration left stock, being shorter than one basket
SHORT_HEADER = "X-Posfair-Stock-Short"
#: /v1/segments answers: the requests the replica answered in the same batch as this one (this one included) ...
BATCH_HEADER = "X-Posfair-Batch-Requests"
#: ... and the forward passes that batch took
PASSES_HEADER = "X-Posfair-Forward-Passes"
#: the longest a request waits to learn whether the model replicas are up (503 past it)
READY_WAIT_S = 1.0
#: the longest /health waits for a replica's answer once they are up
HEALTH_TIMEOUT_S = 2.0
#: a replica's answer (to any request, or to /health's own question) this recent says the replicas answer: /health
#: asks them nothing then, and otherwise asks once for all the /health requests arriving meanwhile
HEALTH_FRESH_S = 5.0
#: API requests (/v1/embeddings, /v1/segments) the gateway holds at once per encoder replica by default, the body
#: being read, waiting for its turn or encoded: one more is answered 503 with Retry-After at once
#: (``--max-queued-requests``); the gateway holds :data:`MAX_QUEUED_REQUESTS` at most, whatever the replicas.
#: Measured (benchmarks/serve_queue.py, 400 one-text requests at once, bundled MiniLM, one replica, 2 cores): held
#: 64 / 128 / 256 / all, the answered ran at 48.6 / 44.5 / 18.8 / 10.0 requests/s, the last after 1.7 / 3.0 /
#: 14.3 / 40.0 s
QUEUED_PER_REPLICA = 128
MAX_QUEUED_REQUESTS = 1000
#: texts one part of a request holds on its way to the replicas (a longer request goes in parts, one at a time;
#: a request arriving meanwhile waits for at most one part)
PART_TEXTS = 16
#: texts one replica batch holds at most (requests arriving together; a part is never split)
BATCH_TEXTS = 256

logger = logging.getLogger("posfair.serve")

api = FastAPI(title="posfair serve", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False)


def _error(err: ApiError, headers: dict | None = None) -> JSONResponse:
    """``err`` in OpenAI's shape; a 503 (the server cannot answer now) always says when to retry."""
    if err.status == 503:
        headers = {"Retry-After": "1"} | (headers or {})
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


_LOADING = _unavailable("the model is loading (or its replica is being replaced); retry when GET /health answers 200")
_STOPPING = _unavailable("the server is stopping; retry on another")
_RETRY = {"Retry-After": "1"}


# defined before the deployments: Ray Serve takes their code with what it names at that point
def _part(req: EmbeddingRequest, chosen: list[int]) -> EmbeddingRequest:
    texts = tuple(req.texts[i] for i in chosen)
    return EmbeddingRequest(texts, req.encoding_format, req.calibration, req.prompt_name, req.dimensions)


def _renumber(message: str, chosen: list[int], total: int) -> str:
    """A part's message ``N of M inputs ... (first: input K, ...)`` or ``input K ...`` said of the whole request:
    K the text's index in the request, the count a lower bound (the parts after it are not checked)."""
    message = re.sub(r"\b(\d+) of \d+ inputs are", rf"at least \1 of the request's {total} inputs are", message)
    message = message.replace("(first: input", "(one: input")
    return re.sub(r"\binput (\d+)", lambda m: f"input {chosen[int(m.group(1))]}", message)


@serve.deployment(
    name=GATEWAY,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1024,
    health_check_period_s=2,
    graceful_shutdown_timeout_s=20,
)
@serve.ingress(api)
class Gateway:
    """The HTTP side (see the module's description); ``encoder`` the handle the composition gives it."""

    def __init__(self, encoder: Any, settings: dict[str, Any]):
        replica_grpc_on_loopback()
        self.encoder = encoder
        self.served_name = settings["served_name"]
        self.key_sha256 = settings.get("key_sha256")
        self.created = int(settings.get("created") or time.time())
        self.timeout_s = float(settings.get("request_timeout_s") or 600)
        self.cors = tuple(settings.get("cors_origins") or ())
        self.max_tokens = settings.get("max_request_tokens")  # None: no budget
        self.share = FairShare(int(settings.get("replicas") or 1))  # a client's long requests: its parts in turn
        self._up = False  # the replicas answered since the last failure
        self._ping: asyncio.Future | None = None
        self._draining = False
        self._in_flight = 0
        replicas = int(settings.get("replicas") or 1)
        self.max_queued = int(
            settings.get("max_queued_requests") or min(QUEUED_PER_REPLICA * replicas, MAX_QUEUED_REQUESTS)
        )
        self._answered = -float("inf")  # time.monotonic() of the replicas' last answer
        self._probe: asyncio.Future | None = None  # /health's question to the replicas, shared

    # -- readiness, from the handle ----------------------------------------------------------------------------------
    async def _ask(self) -> None:
        try:
            await self.encoder.info.remote()
            self._up, self._answered = True, time.monotonic()
        except Exception:  # noqa: BLE001 -- no replica answered: not up
            self._up = False

    async def _ready(self, wait: float = READY_WAIT_S) -> bool:
        """Whether the model replicas answer: at once once they have, else one question shared by every request
        arriving meanwhile, waited for at most ``wait`` seconds."""
        if self._up:
            return True
        if self._ping is None or self._ping.done():
            self._ping = asyncio.ensure_future(self._ask())
        try:
            await asyncio.wait_for(asyncio.shield(self._ping), wait)
        except (TimeoutError, asyncio.TimeoutError):
            return False
        return self._up

    # -- checks ------------------------------------------------------------------------------------------------------
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

    def _check_origin(self, request: Request) -> None:
        """A request from a web page (an ``Origin`` header) only from an origin allowed by ``--cors-origin``."""
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.cors and "*" not in self.cors:
            raise ApiError(403, "requests from web pages of this origin are not allowed (--cors-origin)")

    @staticmethod
    def _check_type(request: Request) -> None:
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise ApiError(
                415,
                "the request body must be JSON sent as 'Content-Type: application/json'",
                code="unsupported_media_type",
            )
        if request.headers.get("content-encoding", "identity").lower() not in ("identity", ""):
            raise ApiError(
                415, "the request body must not be compressed (Content-Encoding)", code="unsupported_media_type"
            )

    @staticmethod
    async def _body(request: Request) -> bytes:
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

    def _cors_headers(self, request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin is None or not self.cors:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    # -- the replicas ------------------------------------------------------------------------------------------------
    async def _call(self, method: str, req: EmbeddingRequest) -> Answer:
        from ray.exceptions import ActorUnavailableError, RayActorError

        try:
            answer = await getattr(self.encoder, method).remote(req)
            self._answered = time.monotonic()
            return answer
        except (RayActorError, ActorUnavailableError, serve.exceptions.DeploymentUnavailableError) as exc:
            self._up, self._answered = False, -float("inf")
            logger.warning("an encoder replica failed under a request: %s", type(exc).__name__)
            raise _unavailable("the model replica serving this request stopped; retry") from None
        except serve.exceptions.BackPressureError:
            raise _unavailable("the server is overloaded; retry") from None

    async def _embed(self, req: EmbeddingRequest, client: str) -> Answer:
        """A request's answer, its texts sent in parts of at most :data:`PART_TEXTS`, one part at a time, each in one
        of ``client``'s turns (:class:`posfair.serve.sharing.FairShare`: a client's long requests share its turns):
        the texts ordered by length first (each part's texts of about one length: little padding), the vectors put
        back in the request's order.  A part's refusal is the request's (the first one stops it)."""
        if len(req.texts) <= PART_TEXTS:
            return self._within_budget(await self._call("embed", req))
        order = sorted(range(len(req.texts)), key=lambda i: len(req.texts[i]))
        parts = []
        for start in range(0, len(order), PART_TEXTS):
            chosen = order[start : start + PART_TEXTS]
            async with self.share.turn(client):
                part = await self._call("embed_part", _part(req, chosen))
            if part.error is not None:
                message = part.error["error"].get("message", "")
                part.error["error"]["message"] = _renumber(message, chosen, len(order))
                return part
            parts.append(part)
            spent = sum(p.tokens for p in parts)
            if self.max_tokens is not None and spent > self.max_tokens:  # the rest is not encoded
                return self._within_budget(Answer(tokens=spent), more=start + PART_TEXTS < len(order))
        vectors = np.empty((len(order), parts[0].vectors.shape[1]), dtype=parts[0].vectors.dtype)
        vectors[order] = np.concatenate([p.vectors for p in parts])
        return Answer(
            vectors,
            sum(p.tokens for p in parts),
            sum(p.truncated for p in parts),
            short=sum(p.short for p in parts),
        )

    async def _segments(self, req: EmbeddingRequest) -> Answer:
        return self._within_budget(await self._call("segments", req))

    def _within_budget(self, answer: Answer, more: bool = False) -> Answer:
        """``answer``, or 413 when its tokens are over the server's ``--max-request-tokens``."""
        if self.max_tokens is None or answer.error is not None or answer.tokens <= self.max_tokens:
            return answer
        return Answer.refused(
            ApiError(
                413,
                f"the request holds {'over ' if more else ''}{answer.tokens} tokens, over this server's budget of "
                f"{self.max_tokens} tokens per request (--max-request-tokens); send fewer texts",
                "invalid_request_error",
                "input",
                "request_too_large",
            )
        )

    async def _within(self, work: Any, deadline: float, hint: str) -> Any:
        """``work`` awaited until ``deadline`` (the request's --request-timeout from its arrival); 408 past it."""
        try:
            return await asyncio.wait_for(work, max(deadline - time.monotonic(), 0.001))
        except (TimeoutError, asyncio.TimeoutError):
            raise ApiError(
                408,
                f"the request took over {self.timeout_s:g} s (the server's --request-timeout); {hint}",
                code="request_timeout",
            ) from None

    async def _answer(self, request: Request, segments: bool) -> Response:
        cors = self._cors_headers(request)
        if self._draining:
            return _error(_STOPPING, _RETRY | cors)
        if self._in_flight >= self.max_queued:  # refused at once, before its body is read
            full = _unavailable(
                f"the server is overloaded: it holds {self.max_queued} requests already (--max-queued-requests); "
                "retry after the time Retry-After says"
            )
            return _error(full, _RETRY | cors)
        self._in_flight += 1
        try:
            self._check_origin(request)
            self._check_key(request)
            self._check_type(request)
            deadline = time.monotonic() + self.timeout_s  # the body's arrival counts too: a slow drip ends in 408
            raw = await self._within(self._body(request), deadline, "its body did not arrive")
            req = parse_request(raw, self.served_name, segments=segments)
            if not await self._ready():
                return _error(_LOADING, _RETRY | cors)
            client = request.client.host if request.client is not None else ""
            work = self._segments(req) if segments else self._embed(req, client)
            answer = await self._within(work, deadline, "send fewer texts")
        except ApiError as err:
            return _error(err, cors or None)
        finally:
            self._in_flight -= 1
        if answer.error is not None:
            return JSONResponse(answer.error, status_code=answer.status, headers=cors or None)
        headers = dict(cors)
        if answer.truncated:
            headers[TRUNCATED_HEADER] = str(answer.truncated)
        if answer.short:
            headers[SHORT_HEADER] = str(answer.short)
        if segments:
            headers |= {BATCH_HEADER: str(answer.batch_requests), PASSES_HEADER: str(answer.forward_passes)}
        body = embedding_response(answer.vectors, req.encoding_format, self.served_name, answer.tokens)
        return JSONResponse(body, headers=headers or None)

    @api.post("/v1/embeddings")
    async def embeddings(self, request: Request) -> Response:
        return await self._answer(request, segments=False)

    @api.post("/v1/segments")
    async def segments(self, request: Request) -> Response:
        return await self._answer(request, segments=True)

    @api.options("/v1/embeddings")
    @api.options("/v1/segments")
    @api.options("/v1/models")
    async def preflight(self, request: Request) -> Response:
        """A CORS preflight: allowed only for the ``--cors-origin`` origins (none by default: 403)."""
        origin = request.headers.get("origin")
        if origin is None or (origin not in self.cors and "*" not in self.cors):
            return _error(ApiError(403, "requests from web pages of this origin are not allowed (--cors-origin)"))
        return Response(
            status_code=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": "GET, POST",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )

    @api.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        try:
            self._check_origin(request)
            self._check_key(request)
        except ApiError as err:
            return _error(err)
        if self._draining:
            return _error(_STOPPING, _RETRY)
        if not await self._ready():
            return _error(_LOADING, _RETRY)
        return JSONResponse(models_response(self.served_name, self.created), headers=self._cors_headers(request))

    async def _ask_health(self) -> None:
        try:
            await asyncio.wait_for(self.encoder.info.remote(), HEALTH_TIMEOUT_S)
            self._answered = time.monotonic()
        except Exception:  # noqa: BLE001 -- replaced, stopped, overloaded: not ready now
            self._up = False

    async def _replicas_answer(self) -> bool:
        """Whether the replicas answered within :data:`HEALTH_FRESH_S` (any request's answer counts), else one
        question (:data:`HEALTH_TIMEOUT_S` at most) shared by every /health arriving meanwhile: /health under load
        puts no request per call into the replicas' queue."""
        if time.monotonic() - self._answered < HEALTH_FRESH_S:
            return True
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(self._ask_health())
        await asyncio.shield(self._probe)
        return time.monotonic() - self._answered < HEALTH_FRESH_S

    @api.get("/health")
    @api.head("/health")
    async def health(self) -> JSONResponse:
        """200 while the replicas answer (HEAD: the same status, no body), else 503 with Retry-After."""
        if self._draining:
            return _error(_STOPPING, _RETRY)
        if not await self._ready():
            return _error(_LOADING, _RETRY)
        if not await self._replicas_answer():
            return _error(_unavailable("the model replicas do not answer"), _RETRY)
        return JSONResponse({"status": "ok", "model": self.served_name})

    async def drain(self, timeout_s: float = 15.0) -> int:
        """Stop taking requests (503 "stopping" from now on) and wait, at most ``timeout_s``, for those in flight;
        the number still in flight then.  Called on the gateway's handle by ``posfair serve`` when it stops."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._in_flight


def _texts_in(requests: list[EmbeddingRequest]) -> int:
    return sum(len(r.texts) for r in requests)


def _tokens_in(docs: list[Document]) -> int:
    return sum(d.size for d in docs)


@serve.deployment(
    name=ENCODER,
    max_ongoing_requests=64,
    health_check_period_s=5,
    health_check_timeout_s=60,
    graceful_shutdown_timeout_s=5,
)
class Encoder:
    """A model replica (see the module's description); ``settings`` as :func:`posfair.serve.app.encoder_settings`."""

    def __init__(self, settings: dict[str, Any]):
        replica_grpc_on_loopback()
        threads = held_threads() or settings.get("threads")  # the CPUs Ray gave this replica (a config may differ)
        if threads:
            torch.set_num_threads(int(threads))
        spec = EmbedSpec.from_dict(settings["spec"])
        model = spec.load_model(settings.get("device"))
        if settings.get("fingerprint") and model.fingerprint != settings["fingerprint"]:
            raise RuntimeError(
                f"replica model fingerprint {model.fingerprint} differs from the one the server checked "
                f"({settings['fingerprint']}): install the same model files and library versions on every node"
            )
        self.engine = Engine(
            model, spec, truncate=settings["truncate"], request_calibration=settings["request_calibration"]
        )
        self._segments_batch.set_max_batch_size(spec.max_batch_tokens)  # a batch of documents: --max-batch-tokens
        self.started = time.time()

    def info(self) -> dict[str, Any]:
        """What the gateway asks to know the replica is up: the model's token limit and width; and where it runs
        (its Ray node, its torch threads: the CPUs Ray gave it)."""
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        return {
            "limit": self.engine.limit,
            "width": self.engine.width,
            "started": self.started,
            "node": node,
            "threads": torch.get_num_threads(),
        }

    def check_health(self) -> None:
        """Serve's health check: a replica whose last forward passes all failed, whatever the request, is unhealthy
        (Serve replaces it)."""
        if self.engine.failing():
            raise RuntimeError("the model's forward passes fail for every request")

    @serve.batch(max_batch_size=BATCH_TEXTS, batch_wait_timeout_s=0.005, batch_size_fn=_texts_in)
    async def embed(self, requests: list[EmbeddingRequest]) -> list[Answer]:
        return await asyncio.to_thread(self.engine.embed_many, requests)

    # the parts of long requests queue apart from short requests: a short request arriving while a part is encoded
    # waits for that part only (the replica's one forward pass at a time), never for the next part as well, which
    # one shared queue would batch it with
    @serve.batch(max_batch_size=BATCH_TEXTS, batch_wait_timeout_s=0.005, batch_size_fn=_texts_in)
    async def embed_part(self, requests: list[EmbeddingRequest]) -> list[Answer]:
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
