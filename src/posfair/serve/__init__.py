"""posfair.serve: calibrated embeddings over HTTP (``posfair serve``), on Ray Serve.

* :mod:`posfair.serve.openai_api` -- the OpenAI embeddings API's requests, answers and errors (no Ray, no model).
* :mod:`posfair.serve.engine` -- what a replica computes: token-budget batches of many requests
  (:mod:`posfair.distributed`'s batching, as ``posfair embed``), late chunking of one document
  (the span pooling of :mod:`posfair.retrieval.late`).
* :mod:`posfair.serve.deployments` -- the Ray Serve deployments (the HTTP gateway, the model replicas).
* :mod:`posfair.serve.application` -- the application builder :func:`app` (``posfair.serve:app``, for
  ``posfair serve``, ``serve run``, ``serve deploy`` and a RayService) and its typed arguments :class:`AppArgs`.
* :mod:`posfair.serve.cluster` -- where ``posfair serve`` runs: a Ray instance of its own (on the loopback when it
  listens there) or a running cluster, and what a Serve instance already running there allows.
* :mod:`posfair.serve.runner` -- ``posfair serve``: start, serve until Ctrl-C / SIGTERM or a fault, stop (what it
  adds to ``serve run``: one-line errors, signals in every state, health notes, a drained stop within 25 s).

Ray Serve is optional (the extra ``serve``); only :mod:`~posfair.serve.deployments` and a running
server import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posfair.runtime.lazy import lazy_exports

if TYPE_CHECKING:  # what IDEs and type checkers see; at run time each name is imported on first use
    from posfair.serve.application import AppArgs, app  # noqa: F401
    from posfair.serve.cluster import SERVE_INSTALL_HINT, serve_available  # noqa: F401
    from posfair.serve.openai_api import MAX_BODY_BYTES, MAX_INPUTS, ApiError, EmbeddingRequest, parse_request  # noqa: F401
    from posfair.serve.runner import ServerSettings, serve_model  # noqa: F401

_EXPORTS = {
    "AppArgs": ".application",
    "app": ".application",
    "MAX_BODY_BYTES": ".openai_api",
    "MAX_INPUTS": ".openai_api",
    "ApiError": ".openai_api",
    "EmbeddingRequest": ".openai_api",
    "parse_request": ".openai_api",
    "SERVE_INSTALL_HINT": ".cluster",
    "ServerSettings": ".runner",
    "serve_available": ".cluster",
    "serve_model": ".runner",
}

__all__, __getattr__, __dir__ = lazy_exports("posfair.serve", _EXPORTS)
