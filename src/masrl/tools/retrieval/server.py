"""HTTP retrieval server: ``POST /retrieve`` and ``GET /health``, on 127.0.0.1 by default.

Request:  {"queries": ["..."], "topk": 3, "return_scores": true}
Response: Search-R1's shape (``wire``): {"result": [[{"document": {"id", "contents"}, "score": 1.2}, ...], ...]},
          or without scores {"result": [[{"id", "contents"}, ...], ...]}

Bad requests get a 4xx with ``{"error": "..."}`` that says what to fix. A connection that sends
nothing (or half a request) for ``idle_timeout_s`` is closed; past ``max_connections`` open ones a
new connection gets a 503 at once. Queries of requests that arrive together are looked up in one
index call (``QueryBatcher``), which is where the throughput under many clients comes from.
"""

from __future__ import annotations

import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from masrl.tools.retrieval.index import BM25Index
from masrl.tools.retrieval.wire import to_wire

MAX_BODY = 1 << 20
MAX_QUERIES = 256
MAX_TOPK = 100
MAX_QUERY_CHARS = 2000


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def validate(body: bytes) -> tuple[list[str], int, bool]:
    try:
        req = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(req, dict):
        raise BadRequest(400, "body must be a JSON object with 'queries'")
    unknown = set(req) - {"queries", "topk", "return_scores"}
    if unknown:
        raise BadRequest(400, f"unknown field(s) {sorted(unknown)}; allowed: queries, topk, return_scores")
    queries = req.get("queries")
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest(400, "'queries' must be a list of strings")
    if not queries:
        raise BadRequest(400, "'queries' is empty; send at least one query")
    if len(queries) > MAX_QUERIES:
        raise BadRequest(413, f"{len(queries)} queries in one request; at most {MAX_QUERIES}")
    if any(len(q) > MAX_QUERY_CHARS for q in queries):
        raise BadRequest(413, f"a query is longer than {MAX_QUERY_CHARS} characters")
    topk = req.get("topk", 3)
    if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= MAX_TOPK:
        raise BadRequest(400, f"'topk' must be an integer from 1 to {MAX_TOPK}, got {topk!r}")
    scores = req.get("return_scores", False)
    if not isinstance(scores, bool):
        raise BadRequest(400, "'return_scores' must be true or false")
    return queries, topk, scores


class QueryBatcher:
    """One thread that serves every handler's lookups: it takes all requests waiting (up to
    ``max_queries`` queries), runs them as one index call at the largest ``topk`` with its queries
    scored on all cores, and hands each request its own rows."""

    def __init__(self, index: BM25Index, *, max_queries: int = 512, threads: int | None = None):
        import os
        import queue

        self.index = index
        self.threads = threads or os.cpu_count() or 1  # a batch's queries are scored in parallel
        self.max_queries = max_queries
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.batches = 0
        self.thread = threading.Thread(target=self._serve, daemon=True, name="retriever-batcher")
        self.thread.start()

    def retrieve(self, queries: list[str], topk: int, return_scores: bool) -> list[list[dict]]:
        done = threading.Event()
        slot: dict = {}
        self.queue.put((queries, topk, return_scores, slot, done))
        done.wait()
        if "error" in slot:
            raise slot["error"]
        return slot["result"]

    def _serve(self) -> None:
        import queue

        while True:
            batch = [self.queue.get()]
            n = len(batch[0][0])
            while n < self.max_queries:
                try:
                    item = self.queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
                n += len(item[0])
            queries = [q for item in batch for q in item[0]]
            try:
                found = self.index.retrieve(queries, max(item[1] for item in batch), True, threads=self.threads)
                self.batches += 1
                at = 0
                for qs, topk, scores, slot, _ in batch:
                    rows = found[at : at + len(qs)]
                    at += len(qs)
                    slot["result"] = [[d if scores else {k: v for k, v in d.items() if k != "score"} for d in r[:topk]]
                                      for r in rows]
            except Exception as exc:  # every waiting handler answers 500 with it
                for item in batch:
                    item[3]["error"] = exc
            for item in batch:
                item[4].set()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "masrl-retriever"
    disable_nagle_algorithm = True  # answer in one segment; no 40 ms delayed-ACK stalls on keep-alive
    timeout: float | None = 30.0  # socket timeout: idle keep-alive and half-sent requests are closed
    index: BM25Index  # set by make_handler
    lookup = None  # the index's retrieve, or a QueryBatcher's (set by make_handler)

    def log_message(self, fmt, *args):  # quiet by default
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"status": "ok", "documents": len(self.index)})
        else:
            self._send(404, {"error": f"no route GET {self.path}; use GET /health or POST /retrieve"})

    def do_POST(self):
        if self.path != "/retrieve":
            self._drain()
            self._send(404, {"error": f"no route POST {self.path}; use POST /retrieve"})
            return
        body = self._read_body()
        if body is not None:
            self._answer(body)

    def _read_body(self) -> bytes | None:
        """The request body, or None after answering why not (the connection then closes)."""
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self._send(411, {"error": "send a Content-Length header"})
            self.close_connection = True
            return None
        n = int(length)
        if n > MAX_BODY:
            self._send(413, {"error": f"body of {n} bytes is over the {MAX_BODY}-byte limit"})
            self.close_connection = True
            return None
        return self.rfile.read(n)

    def _answer(self, body: bytes) -> None:
        try:
            queries, topk, scores = validate(body)
        except BadRequest as exc:
            self._send(exc.status, {"error": str(exc)})
            return
        try:
            result = self.lookup(queries, topk, scores)
        except Exception as exc:  # never leave a client hanging
            self._send(500, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"})
            return
        self._send(200, {"result": to_wire(result, scores)})

    def _drain(self):
        n = self.headers.get("Content-Length")
        if n and n.isdigit() and int(n) <= MAX_BODY:
            self.rfile.read(int(n))


def make_handler(index: BM25Index, batcher: QueryBatcher | None = None, idle_timeout_s: float | None = 30.0):
    """A request handler class over ``index`` (through ``batcher`` when given)."""
    lookup = batcher.retrieve if batcher is not None else index.retrieve
    return type("Handler", (_Handler,), {"index": index, "lookup": staticmethod(lookup), "timeout": idle_timeout_s})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 resets connections under concurrent clients
    max_connections = 256

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.open_sockets: set = set()
        self._sock_lock = threading.Lock()
        self.refused = 0

    def process_request(self, request, client_address):
        with self._sock_lock:
            full = len(self.open_sockets) >= self.max_connections
        if full:  # answer at once instead of starting one more thread
            body = json.dumps({"error": f"the server holds {self.max_connections} connections; retry later"}).encode()
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            except OSError:
                pass
            self.refused += 1
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        with self._sock_lock:
            self.open_sockets.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._sock_lock:
                self.open_sockets.discard(request)

    def close_open_connections(self) -> None:
        import socket

        with self._sock_lock:
            socks = list(self.open_sockets)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class RetrieverServer:
    """Serve an index in a background thread (tests, benchmarks) or the foreground (CLI)."""

    def __init__(self, index: BM25Index, host: str = "127.0.0.1", port: int = 0, *, idle_timeout_s: float = 30.0,
                 max_connections: int = 256, batch: bool = True):
        self.batcher = QueryBatcher(index) if batch else None
        self.httpd = _Server((host, port), make_handler(index, self.batcher, idle_timeout_s))
        self.httpd.daemon_threads = True
        self.httpd.max_connections = max_connections
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "RetrieverServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving and drop kept-alive connections, as a killed server would."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd.close_open_connections()
        if self.thread is not None:
            self.thread.join(timeout=5)


def wait_healthy(url: str, timeout_s: float = 30.0) -> bool:
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == HTTPStatus.OK:
                    return True
        except OSError:
            time.sleep(0.1)
    return False
