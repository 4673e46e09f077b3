"""At most as many requests in the app at once as the database pool has connections.

A request's session keeps its connection until the request ends, and a sync route's response is validated
in the thread pool after the route returns. With more requests in flight than connections, the pool's
threads can all be waiting for a connection while the requests holding the connections wait for a thread to
validate their answers: nothing moves until the pool's timeout fails them all (64 clients against 15
connections and 40 threads did this within a second). Requests over the limit wait here, on the event loop,
holding neither a thread nor a connection.
"""

from __future__ import annotations

import asyncio
import weakref

from starlette.types import ASGIApp, Receive, Scope, Send


class RequestSlots:
    def __init__(self, app: ASGIApp, slots: int):
        self.app = app
        self.slots = slots
        # One per event loop: a semaphore is bound to the loop it was first used on, and an app may serve on
        # several in turn (a test client's, then another's); the server has one.
        self._semaphores: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = \
            weakref.WeakKeyDictionary()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.slots)
        async with semaphore:
            await self.app(scope, receive, send)
