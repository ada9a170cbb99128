"""Run the app under uvicorn on a socket bound here (so a busy port is a one-line error before
anything loads, and ``--port 0`` picks a free one whose number is printed), and say the URL
once the server accepts connections."""

from __future__ import annotations

import asyncio
import socket
from typing import Callable

from specc.errors import UserError


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); UserError when that address cannot be had."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r}: {exc.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def run_server(app, sock: socket.socket, on_ready: Callable[[str], None] | None = None,
               log_level: str = "warning") -> None:
    """Serve ``app`` on ``sock`` until interrupted (Ctrl-C / SIGTERM: uvicorn shuts down
    gracefully); ``on_ready(url)`` runs once connections are accepted."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=5))

    async def main():
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started and on_ready is not None:
            on_ready(url_of(sock))
        await serving

    asyncio.run(main())
