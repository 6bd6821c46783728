"""The HTTP server every masrl server runs on (the gateway, ``masrl serve``, the retriever): aiohttp
with the walls a server that other programs reach needs.

- **Time limits.** A connection must deliver a whole request line and headers within
  ``idle_timeout_s`` of opening (and of its previous response), and its body within
  ``body_timeout_s`` once the headers are in; otherwise it is closed (408 for a late body). A
  client that opens sockets and sends half a request holds them for seconds, not for ever.
- **A connection cap.** Past ``max_connections`` open connections a new one gets a 503 at once
  (``{"error": ...}`` saying so) and is closed; the ones already open are served.
- **A body cap.** Bodies over ``max_body_bytes`` get a 413 before any of them is parsed.
- **Nothing to fingerprint.** The ``Server`` header says ``masrl``, no versions.
- ``bind`` takes the port at once, so a port in use is a one-line error before a model loads.
- ``same_key`` compares API keys in constant time; ``loopback_host`` tells whether a request was
  addressed to this machine by a loopback name (a server without a key answers only those, which
  keeps a web page from reaching it through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
from dataclasses import dataclass

from masrl.errors import MasrlError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class ServerLimits:
    idle_timeout_s: float = 30.0  # request line and headers must arrive within this
    body_timeout_s: float = 30.0  # the body, once the headers are in
    max_connections: int = 1024  # open connections; past it a new one gets a 503
    max_body_bytes: int = 16 * 2**20


class PortInUse(MasrlError):
    pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port), or ``PortInUse`` in one line."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another port (--port, or 0 "
                        f"for any free one) or stop what holds it") from None
    sock.listen(512)
    sock.setblocking(False)
    return sock


def loopback_host(host_header: str | None) -> bool:
    """Whether a request's ``Host`` names this machine by a loopback name (any port)."""
    if not host_header:
        return False
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[: host.find("]") + 1]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host in LOOPBACK_NAMES


def same_key(given: str | None, expected: str) -> bool:
    """``Authorization: Bearer <key>`` checked in constant time."""
    return given is not None and hmac.compare_digest(given.encode(), f"Bearer {expected}".encode())


def error_bytes(status: int, reason: str, payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Server: masrl\r\nConnection: close\r\n\r\n").encode() + body


class _Refuse(asyncio.Protocol):
    """A connection past the cap: one 503, then closed."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def connection_made(self, transport) -> None:
        transport.write(self.payload)
        transport.close()


class Server:
    """An aiohttp app on a socket, inside the limits. ``await start()``, ``await stop()``."""

    def __init__(self, app, sock: socket.socket, limits: ServerLimits | None = None, *, refusal: dict | None = None):
        self.app, self.sock, self.limits = app, sock, limits or ServerLimits()
        self.refused = 0
        self.refusal = error_bytes(503, "Service Unavailable", refusal or {
            "error": f"too many open connections (more than {self.limits.max_connections}); try again shortly"})
        self._runner = None
        self._server = None

        async def no_version(request, response):
            response.headers["Server"] = "masrl"

        app.on_response_prepare.append(no_version)

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    @property
    def open_connections(self) -> int:
        return len(self._runner.server.connections) if self._runner is not None and self._runner.server else 0

    async def start(self) -> None:
        from aiohttp import web

        _room_for(self.limits.max_connections)
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                                     keepalive_timeout=self.limits.idle_timeout_s, lingering_time=0)
        await self._runner.setup()
        server = self._runner.server

        def connection():
            if len(server.connections) >= self.limits.max_connections:
                self.refused += 1
                return _Refuse(self.refusal)
            return server()

        self._server = await asyncio.get_running_loop().create_server(  # a backlog that holds a burst of connects
            connection, sock=self.sock, backlog=max(128, min(self.limits.max_connections, 4096)))

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def read_body(request, limits: ServerLimits) -> bytes:
    """The request's body within the time and size limits; ``BodyError`` (408, 413) otherwise."""
    from aiohttp import web

    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise BodyError(413, f"the body has {request.content_length:,} bytes, over this server's limit of "
                             f"{limits.max_body_bytes:,}")
    try:
        return await asyncio.wait_for(request.read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        if request.transport is not None:
            request.transport.close()
        raise BodyError(408, f"the body did not arrive within {limits.body_timeout_s:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, f"the body is over this server's limit of {limits.max_body_bytes:,} bytes") from None


class BodyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _room_for(connections: int) -> None:
    """Raise this process's soft limit on open files (up to the hard one) so that the connection cap,
    not the descriptor limit, is what a flood meets."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = connections + 256
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    except (ImportError, ValueError, OSError):
        pass
