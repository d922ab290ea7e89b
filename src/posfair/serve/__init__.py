"""posfair.serve: calibrated embeddings over HTTP (``posfair serve``), on Ray Serve.

* :mod:`posfair.serve.openai_api` -- the OpenAI embeddings API's requests, answers and errors (no Ray, no model).
* :mod:`posfair.serve.engine` -- what a replica computes: token-budget batches of many requests
  (:mod:`posfair.distributed`'s batching, as ``posfair embed``), late chunking of one document
  (the span pooling of :mod:`posfair.retrieval.late`).
* :mod:`posfair.serve.deployments` -- the Ray Serve deployments (the HTTP gateway, the model replicas).
* :mod:`posfair.serve.runner` -- start, serve until Ctrl-C / SIGTERM, stop.

Ray Serve is optional (the extra ``serve``); only :mod:`~posfair.serve.deployments` and a running
server import it.
"""

from posfair.serve.openai_api import MAX_BODY_BYTES, MAX_INPUTS, ApiError, EmbeddingRequest, parse_request
from posfair.serve.runner import SERVE_INSTALL_HINT, ServerSettings, serve_available, serve_model

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_INPUTS",
    "SERVE_INSTALL_HINT",
    "ApiError",
    "EmbeddingRequest",
    "ServerSettings",
    "parse_request",
    "serve_available",
    "serve_model",
]
