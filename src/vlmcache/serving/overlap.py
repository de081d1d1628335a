"""A miss's engine call, started while the cascade's similarity tiers still look.

On a miss the front's similarity lookups (image and text embeddings, vector search,
verification) are most of its time before the engine starts: on an idle engine, all of
it is added to the time to first token. :class:`OverlappedCall` starts the engine on the
body the request gets if those lookups find nothing (its own content identities, tenant
salt: exactly what a miss forwards) and holds every message the engine sends until the
cascade decides:

- the cascade forwards exactly that body: the call is the answer, its messages go on;
- the cascade canonicalized the request, or found a stored answer: the call is told its
  client left (``http.disconnect``, on which vLLM's server aborts the request, and so does
  ``vlmcache proxy``'s upstream call) and nothing it sends reaches the client.

So no answer changes: a kept call ran on the body the cascade chose. What a dropped call
costs is the engine's work until it saw the disconnect, which is why the front overlaps
only while it has fewer than ``miss_overlap_max_inflight`` engine calls in flight.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import anyio

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

#: How long a dropped call's next message waits for the call to be cancelled by its own
#: disconnect handling (vLLM's and the proxy's are) before it is discarded.
DROP_GRACE_S = 0.25


class InFlight:
    """Engine calls this front process has in flight (one event loop: no lock needed)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    def take(self) -> bool:
        """A slot for a call started before the cascade decides, if there is room (then
        :meth:`release` it when the call ends)."""
        if self.count >= self.limit:
            return False
        self.count += 1
        return True

    def release(self) -> None:
        self.count -= 1

    def __enter__(self) -> "InFlight":
        self.count += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.count -= 1


class OverlappedCall:
    """One engine call on a miss's body, its output held until :meth:`keep` or
    :meth:`drop`. ``app`` sends the body itself (an ``EngineCall``); ``receive`` gives the
    client's messages after its body."""

    def __init__(self, app: App, scope: Scope, receive: Receive) -> None:
        self.app, self.scope, self._receive = app, scope, receive
        self._decided = anyio.Event()
        self._dropped = anyio.Event()
        self._target: Send | None = None

    async def run(self) -> None:
        """The engine call; a dropped call's errors are its own (logged, never raised)."""
        # a client that listens: apps (Starlette's streaming responses) watch receive()
        # for the disconnect rather than expect send() to raise
        scope = {**self.scope, "asgi": {**self.scope.get("asgi", {}), "spec_version": "2.3"}}
        try:
            await self.app(scope, self._listen, self._send)
        except Exception:  # noqa: BLE001 -- only a dropped call may fail unseen
            if not self._dropped.is_set():
                raise
            logger.debug("front: a dropped overlapped call ended with an error",
                         exc_info=True)

    def keep(self, target: Send) -> None:
        """The call is the answer: what it sent and sends goes to ``target``."""
        self._target = target
        self._decided.set()

    def drop(self) -> None:
        """Abort the call: its client disconnects, nothing it sends goes anywhere."""
        self._dropped.set()
        self._decided.set()

    async def _send(self, message: Message) -> None:
        await self._decided.wait()
        if self._target is not None:
            await self._target(message)
            return
        # dropped: give the app's disconnect handling a moment to cancel it, then discard
        await anyio.sleep(DROP_GRACE_S)

    async def _listen(self) -> Message:
        if self._dropped.is_set():
            return {"type": "http.disconnect"}
        got: list[Message] = []
        async with anyio.create_task_group() as tg:
            async def client() -> None:
                got.append(await self._receive())
                tg.cancel_scope.cancel()

            async def dropped() -> None:
                await self._dropped.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(client)
            tg.start_soon(dropped)
        return got[0] if got else {"type": "http.disconnect"}
