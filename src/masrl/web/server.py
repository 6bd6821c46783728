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
- **One error shape.** Every answer the server gives itself (a malformed request line or header, a route
  or method it does not have, a body that does not decode, a refused connection, a bug of ours) is JSON
  in the server's own error shape (``error_shape``), and a malformed request logs one line, not a
  traceback, so nobody can flood the log on demand.
- ``load_json`` reads a body as JSON or says why not (not UTF-8, not JSON, nested too deeply, a number
  with too many digits) as a 400.
- ``bind`` takes the port at once, so a port in use (or out of range) is a one-line error before a model
  loads.
- ``same_key`` compares API keys in constant time (any header bytes); ``loopback_host`` parses a
  ``Host`` strictly and tells whether it names this machine by a loopback name (a server without a key
  answers only those, which keeps a web page from reaching it through DNS rebinding).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any, Callable

from masrl.errors import ConfigError, MasrlError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# a Host header: a name or IPv4 address, or a bracketed IPv6 address, and an optional port; nothing else
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]|(?P<name>[A-Za-z0-9.-]{1,253}))(?::[0-9]{1,5})?")
log = logging.getLogger("masrl.http")
ErrorShape = Callable[[int, str], dict]


def bounded(kind, low: float, high: float):
    """An argparse ``type`` for a numeric flag: a finite ``kind`` within ``[low, high]``, else a usage error that
    says the range (0, negative, NaN and inf made servers refuse every request or never time out)."""
    import argparse
    import math

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not math.isfinite(v) or not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {low:g} to {high:g}")
        return v

    return parse


def plain_error(status: int, message: str) -> dict:
    """The default error shape: ``{"error": message}``."""
    return {"error": message}


# each limit's range: (lowest, highest, the flag that sets it)
LIMIT_RANGES = {"idle_timeout_s": (0.01, 3600.0, "--read-timeout-s / --idle-timeout"),
                "body_timeout_s": (0.01, 3600.0, "--read-timeout-s / --idle-timeout"),
                "max_connections": (1, 100_000, "--max-connections"),
                "max_body_bytes": (1024, 4096 * 2**20, "--max-body-mb")}


@dataclass(frozen=True)
class ServerLimits:
    """A server's limits, each checked against its range (``LIMIT_RANGES``): zero, negative, NaN or infinite
    values made a server refuse every request or never close a half-sent connection."""

    idle_timeout_s: float = 30.0  # request line and headers must arrive within this
    body_timeout_s: float = 30.0  # the body, once the headers are in
    max_connections: int = 1024  # open connections; past it a new one gets a 503
    max_body_bytes: int = 16 * 2**20

    def __post_init__(self):
        import math

        for name, (low, high, flag) in LIMIT_RANGES.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not low <= v <= high:
                raise ConfigError(f"{flag}: {v!r} is out of range for {name}; give a number from {low:g} to {high:g}")


class PortInUse(MasrlError):
    pass


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: any free port), or ``PortInUse`` in one line."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise PortInUse(f"cannot listen on port {port}: a port is 0-65535 (0: any free one)")
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
    """Whether a request's ``Host`` names this machine by a loopback name (any port). The header must be
    one host and an optional port and nothing else: ``[::1]evil.com`` or ``localhost.evil.com`` is not
    loopback."""
    if not host_header or len(host_header) > 300:
        return False
    text = host_header.strip()
    if text == "::1":  # an unbracketed IPv6 loopback, as some clients send it
        return True
    m = _HOST.fullmatch(text)
    if m is None:
        return False
    host = f"[{m.group('v6')}]" if m.group("v6") else m.group("name")
    return host.lower() in LOOPBACK_NAMES


def browser_refusal(request) -> tuple[int, str] | None:
    """For a server without a key: why a request that a web page could have sent is refused, or None. A page
    the user opens can POST to 127.0.0.1 (a CSRF path to a local server): its requests carry an ``Origin``
    (refused unless the origin is itself a loopback one), and without a preflight it can send only
    ``text/plain`` or form bodies (a POST must say ``Content-Type: application/json``)."""
    from urllib.parse import urlsplit

    origin = request.headers.get("Origin")
    if origin is not None:
        try:
            host = urlsplit(origin).netloc if origin != "null" else ""
        except ValueError:
            host = ""
        if not loopback_host(host):
            return 403, (f"a cross-origin request (Origin {origin[:100]!r}) to a server without an API key; a web page "
                         f"may not use it (give the server a key to serve other origins)")
    if request.method == "POST":
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return 415, (f"Content-Type {ctype[:60] or '(none)'!r}: send the body as application/json (a server "
                         f"without an API key takes JSON only)")
    return None


def count_values(value: Any, limit: int) -> int:
    """The values in ``value`` (keys, items and leaves of its lists and objects), counted until past ``limit``."""
    count, stack = 0, [value]
    while stack and count <= limit:
        v = stack.pop()
        count += 1
        if isinstance(v, dict):
            count += len(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return count


def same_key(given: str | None, expected: str) -> bool:
    """``Authorization: Bearer <key>`` checked in constant time, whatever bytes the header holds."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), f"Bearer {expected}".encode())


def load_json(raw: bytes, what: str = "the body") -> Any:
    """``raw`` as JSON, or ``BodyError(400)`` saying why not: not UTF-8, not JSON, nested too deeply for
    the parser, or a number with more digits than Python converts."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(400, f"{what} is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise BodyError(400, f"{what} is nested too deeply to read") from None
    except ValueError as exc:  # JSONDecodeError, and an integer past Python's 4,300-digit conversion limit
        if "digits" in str(exc):
            raise BodyError(400, f"{what} holds a number with too many digits ({str(exc)[:120]})") from None
        raise BodyError(400, f"{what} is not valid JSON ({str(exc)[:200]})") from None


def nesting(value: Any, limit: int) -> int:
    """How deeply ``value``'s lists and objects nest, counted up to ``limit + 1`` (the walk stops there)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (list, dict)):
            if d > limit:
                return d
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


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
    """An aiohttp app on a socket, inside the limits. ``await start()``, ``await stop()``. Every answer the
    server makes itself is JSON in ``error_shape``: the refusal past the connection cap, a malformed
    request, a route or method the app lacks, an exception that escaped the app's handlers."""

    def __init__(self, app, sock: socket.socket, limits: ServerLimits | None = None, *,
                 error_shape: ErrorShape = plain_error):
        self.app, self.sock, self.limits, self.error_shape = app, sock, limits or ServerLimits(), error_shape
        self.refused = 0
        self.refusal = error_bytes(503, "Service Unavailable", error_shape(
            503, f"too many open connections (more than {self.limits.max_connections}); try again shortly"))
        self._runner = None
        self._server = None

        async def no_version(request, response):
            response.headers["Server"] = "masrl"

        app.on_response_prepare.append(no_version)
        app.middlewares.insert(0, _json_errors(error_shape))

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    @property
    def open_connections(self) -> int:
        return len(self._runner.server.connections) if self._runner is not None and self._runner.server else 0

    async def start(self) -> None:
        from aiohttp import web

        _room_for(self.limits.max_connections)
        handler_class = _handler_class(self.error_shape)
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None,
                                     keepalive_timeout=self.limits.idle_timeout_s, lingering_time=0)
        await self._runner.setup()
        server = self._runner.server

        def connection():
            if len(server.connections) >= self.limits.max_connections:
                self.refused += 1
                return _Refuse(self.refusal)
            return handler_class(server, loop=server._loop, **server._kwargs)

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
    except asyncio.TimeoutError:  # answered 408, then the connection closes (the rest of the body is never read)
        raise BodyError(408, f"the body did not arrive within {limits.body_timeout_s:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise BodyError(413, f"the body is over this server's limit of {limits.max_body_bytes:,} bytes") from None
    except web.HTTPException as exc:
        raise BodyError(exc.status, f"the body could not be read: {exc.reason}") from None
    except Exception as exc:  # aiohttp's payload errors: a Content-Encoding that does not decode, a broken chunk
        if _payload_error(exc):
            raise BodyError(400, f"the body could not be read: {_one_line(exc)}") from None
        raise


class BodyError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _payload_error(exc: BaseException) -> bool:
    from aiohttp import http_exceptions, web_protocol

    return isinstance(exc, (web_protocol.RequestPayloadError, http_exceptions.HttpProcessingError))


_QUOTED = re.compile(r"b?'(?:[^'\\]|\\.)*'" + r'|b?"(?:[^"\\]|\\.)*"')
_SECRET_HEADER = re.compile(r"(authorization|cookie|x-api-key)\s*:.*", re.I)


def _one_line(exc: BaseException) -> str:
    """An error as one line for the log and the answer, with no header's value in it: the HTTP parser quotes
    the bytes it choked on, which can be the line that holds the API key."""
    text = _QUOTED.sub("(bytes not shown)", str(exc))
    text = _SECRET_HEADER.sub(r"\1: (not shown)", text)
    return " ".join(text.split())[:200] or type(exc).__name__


def json_error(status: int, shape: dict, *, close: bool = False):
    from aiohttp import web as aio

    resp = aio.json_response(shape, status=status)
    if close:
        resp.force_close()
    return resp


def _json_errors(error_shape: ErrorShape):
    """A middleware: aiohttp's own answers (no such route, method not allowed, a bad request) and anything that
    escaped a handler, as JSON in the server's error shape; a bug of ours keeps its traceback in the log."""
    from aiohttp import web as aio

    @aio.middleware
    async def answer(request, handler):
        try:
            return await handler(request)
        except aio.HTTPException as exc:
            if exc.status < 400:
                raise
            return json_error(exc.status, error_shape(exc.status, f"{exc.reason}: {request.method} "
                                                                  f"{request.path[:200]}"), close=exc.status >= 500)
        except BodyError as exc:
            return json_error(exc.status, error_shape(exc.status, exc.message), close=exc.status in (408, 413))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if _payload_error(exc):
                return json_error(400, error_shape(400, f"the request could not be read: {_one_line(exc)}"), close=True)
            log.exception("masrl http: internal error answering %s %s", request.method, request.path[:200])
            return json_error(500, error_shape(500, f"internal error ({type(exc).__name__}); the server log has the "
                                                    f"traceback"), close=True)

    return answer


def _handler_class(error_shape: ErrorShape):
    """aiohttp's connection handler with its protocol-level errors (a malformed request line or header) answered
    in JSON in ``error_shape``, with no version header, and logged as one line rather than a traceback."""
    from aiohttp import web as aio
    from aiohttp.web_protocol import RequestHandler

    class JsonErrors(RequestHandler):
        def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                         message: str | None = None):
            why = _one_line(exc) if exc is not None else (message or "")
            log.warning("masrl http: %s from %s: %s", status, getattr(request, "remote", "?"), why)
            if request.writer.output_size > 0:
                raise ConnectionError("a response was already sent; the connection is dropped")
            text = "the request is malformed" if status < 500 else "internal error"
            resp = aio.Response(status=status, body=json.dumps(error_shape(status, f"{text}: {why}")).encode(),
                                content_type="application/json", headers={"Server": "masrl"})
            resp.force_close()
            return resp

        def log_exception(self, *args, **kwargs) -> None:
            exc = kwargs.get("exc_info")
            log.warning("masrl http: %s%s", (args[0] % args[1:]) if args else "",
                        f": {_one_line(exc)}" if isinstance(exc, BaseException) else "")

    return JsonErrors


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
