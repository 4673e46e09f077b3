"""More requests at once than the database pool has connections: they wait their turn, they do not deadlock."""

from __future__ import annotations

import asyncio

import anyio.to_thread
import httpx

from harness.api import create_app
from harness.config import Settings


def _concurrent_pages(app, n: int, threads: int) -> list[int]:
    async def main() -> list[int]:
        # Fewer threads than requests: a route that holds a connection while it waits for a thread (to validate its
        # answer) and routes that hold every thread while they wait for a connection stop each other.
        anyio.to_thread.current_default_thread_limiter().total_tokens = threads
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
            answers = await asyncio.wait_for(asyncio.gather(*(c.get("/api/submissions") for _ in range(n))), 20)
        return [r.status_code for r in answers]

    return asyncio.run(main())


def test_requests_beyond_the_pools_connections_wait_and_all_get_answers(tmp_path):
    # One connection, two threads, twelve requests: without the admission limit this deadlocks until the pool's
    # timeout (30 s) fails the requests with 500 (asyncio.wait_for raises first).
    settings = Settings(data_dir=tmp_path / "data", db_pool_size=1, db_pool_overflow=0)
    app = create_app(settings)
    try:
        for _ in range(3):
            assert _concurrent_pages(app, 12, threads=2) == [200] * 12
    finally:
        app.state.db.dispose()
