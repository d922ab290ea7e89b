"""Fair shares of the model replicas between clients (the gateway's, no Ray, no model).

A long request goes to the replicas in parts (:data:`posfair.serve.deployments.PART_TEXTS` texts each), one at a
time; :class:`FairShare` also gives each client at most ``parts`` parts in flight, whatever the number of its long
requests: a client sending 32 requests of 2,048 texts at once holds no more of the replicas than one sending one,
its requests take turns part by part (first come, first served), and a request from anyone else waits for at most
one part per client.  A short request (one part or less) takes no turn: it is never queued behind long ones.
A client is the address the request came from (behind a reverse proxy: the proxy's).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["FairShare"]


class FairShare:
    """Per-client turns for the parts of long requests: at most ``parts`` in flight per client (see the module)."""

    def __init__(self, parts: int = 1):
        if parts < 1:
            raise ValueError(f"parts must be at least 1; got {parts}")
        self.parts = parts
        self._turns: dict[str, asyncio.Semaphore] = {}
        self._waiting: dict[str, int] = {}  # requests of the client holding or awaiting a turn

    @contextlib.asynccontextmanager
    async def turn(self, client: str) -> AsyncIterator[None]:
        """Within: one of ``client``'s ``parts`` turns (waited for in arrival order)."""
        turn = self._turns.setdefault(client, asyncio.Semaphore(self.parts))
        self._waiting[client] = self._waiting.get(client, 0) + 1
        try:
            async with turn:
                yield
        finally:
            self._waiting[client] -= 1
            if not self._waiting[client]:  # the client has nothing in flight: forget it
                del self._waiting[client], self._turns[client]

    def clients(self) -> int:
        """Clients with a part in flight or waiting."""
        return len(self._turns)
