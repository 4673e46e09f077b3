"""The socket `harness serve` binds before uvicorn serves on it."""

from __future__ import annotations

import asyncio
import socket

from harness.cli.serve import listen_socket


def test_connections_accepted_on_the_serve_socket_send_without_delay():
    """A response written in two pieces must not wait for the client's delayed ACK (about 40 ms per request on a
    kept-alive connection): asyncio turns Nagle off only on a socket that says it is TCP. A socket made with
    proto 0, as before, fails this."""
    sock = listen_socket("127.0.0.1", 0)
    nodelay: list[int] = []

    async def main() -> None:
        accepted = asyncio.Event()

        def on_connect(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nodelay.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            accepted.set()

        server = await asyncio.start_server(on_connect, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            await asyncio.wait_for(accepted.wait(), 10)
            writer.close()

    asyncio.run(main())
    assert nodelay and nodelay[0] != 0
