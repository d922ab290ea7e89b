"""Issue 58 item 7, the rest of a hostile run, without Ray: whose ``X-Forwarded-For`` Serve's proxy believes
(:func:`posfair.serve.proxy.trust_forwarded`, on uvicorn's own middleware as Serve's proxy builds it), the gateway's
bound on the requests it holds and ``/health`` under load (the gateway's class on a stand-in for the encoder's
handle, in one event loop), and ``posfair serve``'s options for both.  The real server checks the same through
Serve (test_server_faults.py)."""

from __future__ import annotations

import asyncio
import json
import socket

import numpy as np
import pytest

from posfair.serve.engine import Answer

pytestmark = pytest.mark.timeout(120, method="thread")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- X-Forwarded-For ----------------------------------------------------------------------------------------------


def client_seen(peer: str, forwarded: str) -> str:
    """The client address an app behind uvicorn's middlewares sees for a request from ``peer`` saying
    ``X-Forwarded-For: forwarded``, the uvicorn.Config created as Serve's proxy creates it (after the guard ran)."""
    import uvicorn

    seen = []

    async def app(scope, receive, send):
        seen.append(scope["client"][0])

    config = uvicorn.Config(app, lifespan="off", log_level="critical")
    config.load()
    scope = {"type": "http", "client": (peer, 5000), "headers": [(b"x-forwarded-for", forwarded.encode())]}
    asyncio.run(config.loaded_app(scope, None, None))
    return seen[0]


def test_forwarded_for_is_believed_of_no_one_by_default(monkeypatch):
    """A client on the loopback named itself anyone by X-Forwarded-For (uvicorn trusts 127.0.0.1 and ::1 by
    default), taking one fair share of the replicas per name.  Now no one is believed unless a proxy is named."""
    from posfair.serve.proxy import FORWARDED_ENV, TRUSTED_PROXIES_ENV, trust_forwarded

    for name in (TRUSTED_PROXIES_ENV, FORWARDED_ENV):  # set, then removed: monkeypatch restores what was there
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    assert client_seen("127.0.0.1", "203.0.113.7") == "203.0.113.7"  # uvicorn's own default
    trust_forwarded()
    assert client_seen("127.0.0.1", "203.0.113.7") == "127.0.0.1"
    assert client_seen("127.0.0.1", "198.51.100.9") == "127.0.0.1"
    assert client_seen("::1", "198.51.100.9") == "::1"


def test_forwarded_for_is_believed_of_the_trusted_proxies_and_a_users_own_setting_is_kept(monkeypatch):
    from posfair.serve.proxy import FORWARDED_ENV, TRUSTED_PROXIES_ENV, trust_forwarded

    monkeypatch.setenv(TRUSTED_PROXIES_ENV, "10.0.0.0/8, 192.168.1.7")
    monkeypatch.setenv(FORWARDED_ENV, "*")  # posfair's variable wins over it
    trust_forwarded()
    assert client_seen("10.1.2.3", "203.0.113.7") == "203.0.113.7"
    assert client_seen("192.168.1.7", "203.0.113.8") == "203.0.113.8"
    assert client_seen("127.0.0.1", "203.0.113.7") == "127.0.0.1"  # the loopback is not a proxy named
    monkeypatch.delenv(TRUSTED_PROXIES_ENV)
    monkeypatch.setenv(FORWARDED_ENV, "127.0.0.1")  # set by the user, no posfair variable: theirs
    trust_forwarded()
    assert client_seen("127.0.0.1", "203.0.113.7") == "203.0.113.7"


# -- the gateway: its bound, /health ---------------------------------------------------------------------------------


class Encoder:
    """A stand-in for the encoder deployment's handle: ``info`` counted, ``embed`` answered once ``open`` is set
    (each text's vector: its length, then 1, 2)."""

    def __init__(self):
        self.info_calls = 0
        self.open = asyncio.Event()
        self.held = 0

    class _Method:
        def __init__(self, call):
            self.remote = call

    @property
    def info(self):
        async def call():
            self.info_calls += 1
            await asyncio.sleep(0.05)
            return {}

        return self._Method(call)

    @property
    def embed(self):
        async def call(req):
            self.held += 1
            await self.open.wait()
            return Answer(np.array([[len(t), 1.0, 2.0] for t in req.texts], dtype=np.float32), len(req.texts))

        return self._Method(call)


def gateway(encoder, **settings):
    from posfair.serve.deployments import Gateway

    cls = Gateway.func_or_class.__mro__[1]  # the class itself, under Serve's ingress wrapper
    return cls(encoder, {"served_name": "m", **settings})


def embedding_request(text: str):
    from starlette.requests import Request

    body = json.dumps({"model": "m", "input": [text]}).encode()
    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 5000)}  # fmt: skip

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def test_past_the_bound_requests_get_503_with_retry_after_at_once_and_the_others_their_answers():
    """1,500 requests at once were all held (the last answered after 261 s, throughput falling as the queue grew).
    Now the gateway holds at most --max-queued-requests: one more is 503 with Retry-After in OpenAI's shape at once
    (its body unread), while those held get their own answers; the bound frees as they are answered."""

    async def run():
        enc = Encoder()
        gw = gateway(enc, max_queued_requests=3)
        held = [asyncio.ensure_future(gw.embeddings(embedding_request("x" * (i + 1)))) for i in range(3)]
        while enc.held < 3:
            await asyncio.sleep(0.01)
        # answered while 3 are held (the wait only ends a test that would hang: the code before held them too)
        over = [await asyncio.wait_for(gw.embeddings(embedding_request("over")), 30) for _ in range(2)]
        enc.open.set()
        answers = await asyncio.gather(*held)
        after = await gw.embeddings(embedding_request("after"))
        return over, answers, after

    over, answers, after = asyncio.run(run())
    for r in over:
        error = json.loads(r.body)["error"]
        assert r.status_code == 503 and r.headers["retry-after"] == "1", (r.status_code, r.body)
        assert error["type"] == "server_error" and "--max-queued-requests" in error["message"], error
    for i, r in enumerate(answers):
        assert r.status_code == 200, r.body
        assert json.loads(r.body)["data"][0]["embedding"] == [i + 1.0, 1.0, 2.0]  # its own text's vector
    assert after.status_code == 200


def test_the_default_bound_is_per_replica_and_capped():
    from posfair.serve.deployments import MAX_QUEUED_REQUESTS, QUEUED_PER_REPLICA

    assert gateway(Encoder()).max_queued == QUEUED_PER_REPLICA
    assert gateway(Encoder(), replicas=2).max_queued == 2 * QUEUED_PER_REPLICA
    assert gateway(Encoder(), replicas=64).max_queued == MAX_QUEUED_REQUESTS


def test_concurrent_health_requests_share_one_question_to_the_replicas():
    """2,000 concurrent GET /health each put a question into the replicas' queue, behind the API calls: 19 % timed
    out (503 "the model replicas do not answer") while every API call got 200.  Now concurrent /health share one
    question, and a recent answer of the replicas (any request's) is one: 300 at once ask once, and after an API
    answer not at all."""

    async def run():
        enc = Encoder()
        gw = gateway(enc)
        first = await asyncio.gather(*[gw.health() for _ in range(300)])
        asked = enc.info_calls
        gw._answered = -float("inf")  # no recent answer: /health asks, once for all
        second = await asyncio.gather(*[gw.health() for _ in range(300)])
        asked_again = enc.info_calls - asked
        enc.open.set()
        gw._answered = -float("inf")
        assert (await gw.embeddings(embedding_request("api"))).status_code == 200
        before = enc.info_calls
        third = await asyncio.gather(*[gw.health() for _ in range(300)])
        return first + second + third, asked, asked_again, enc.info_calls - before

    answers, asked, asked_again, after_api = asyncio.run(run())
    assert {r.status_code for r in answers} == {200}
    assert (asked, asked_again, after_api) == (1, 1, 0)


# -- posfair serve's options -----------------------------------------------------------------------------------------


@pytest.fixture
def started(monkeypatch):
    """The settings ``posfair serve`` would serve with: ``serve_model`` recorded, not run."""
    import posfair.serve.runner as runner
    from posfair.serve.cluster import RAY_LOCAL_ONLY_ENV

    seen = []
    monkeypatch.setattr(runner, "serve_model", lambda settings, *a, **k: seen.append(settings))
    monkeypatch.delenv(RAY_LOCAL_ONLY_ENV, raising=False)
    return seen


def test_the_options_reach_the_application_and_serves_proxy(tiny_model_path, started):
    from typer.testing import CliRunner

    from posfair.cli import app
    from posfair.serve.cluster import proxy_env
    from posfair.serve.proxy import TRUSTED_PROXIES_ENV

    path, pooling = tiny_model_path("bert")
    base = ["serve", "--model", str(path), "--pooling", pooling, "--port", str(free_port())]
    r = CliRunner().invoke(app, base)
    assert r.exit_code == 0, r.output
    assert started[-1].args.max_queued_requests is None and TRUSTED_PROXIES_ENV not in proxy_env(started[-1].args)
    extra = ["--trusted-proxy", "10.0.0.0/8", "--trusted-proxy", "192.168.1.7", "--max-queued-requests", "8"]
    r = CliRunner().invoke(app, base + extra)
    assert r.exit_code == 0, r.output
    assert started[-1].args.max_queued_requests == 8
    assert proxy_env(started[-1].args)[TRUSTED_PROXIES_ENV] == "10.0.0.0/8,192.168.1.7"


@pytest.mark.parametrize(
    ("option", "value"),
    [("--trusted-proxy", "proxy.example.org"), ("--max-queued-requests", "0"), ("--max-queued-requests", "1001")],
)
def test_a_bad_value_is_one_error_line_exit_2_before_anything_loads(started, option, value):
    from typer.testing import CliRunner

    from posfair.cli import app

    r = CliRunner().invoke(app, ["serve", "--model", "/nonexistent/model", option, value])
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert r.exit_code == 2 and not started, r.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and option in lines[0] and value in lines[0], r.output


def test_app_args_refuse_a_trusted_proxy_that_is_not_an_address():
    from pydantic import ValidationError

    from posfair.serve.application import AppArgs

    assert AppArgs(trusted_proxies=(" 10.0.0.0/8",)).trusted_proxies == ("10.0.0.0/8",)
    with pytest.raises(ValidationError, match="trusted_proxies"):
        AppArgs(trusted_proxies=("proxy.example.org",))
    with pytest.raises(ValidationError, match="max_queued_requests"):
        AppArgs(max_queued_requests=0)
