"""HTTP retrieval server: ``POST /retrieve`` and ``GET /health``, on 127.0.0.1 by default.

Request:  {"queries": ["..."], "topk": 3, "return_scores": true}
Response: Search-R1's shape (``wire``): {"result": [[{"document": {"id", "contents"}, "score": 1.2}, ...], ...]},
          or without scores {"result": [[{"id", "contents"}, ...], ...]}

Bad requests get a 4xx with ``{"error": "..."}`` that says what to fix; every answer is JSON, a malformed
request included. Without an API key it answers only requests addressed to a loopback name (``Host:
127.0.0.1``, ``localhost``, ``[::1]``), so a web page cannot read the corpus through DNS rebinding; with
one (``api_key``, ``masrl retriever serve --api-key-env``) every request must send ``Authorization:
Bearer <key>`` and any host may ask. It runs on the same HTTP stack as the gateway (``masrl.web.server``:
aiohttp in an event loop, no thread per connection): a connection that sends nothing, or half a
request, for ``idle_timeout_s`` is closed; past ``max_connections`` open ones a new connection gets a
503 at once; idle connections cost a socket, not a thread, so a few hundred of them do not shut out new
clients. Queries of requests that arrive together are looked up in one index call (``QueryBatcher``),
which is where the throughput under many clients comes from.
"""

from __future__ import annotations

import asyncio
import threading
import time
from http import HTTPStatus

from masrl.tools.retrieval.index import BM25Index
from masrl.tools.retrieval.wire import to_wire
from masrl.web import server as web

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
        req = web.load_json(body)
    except web.BodyError as exc:
        raise BadRequest(exc.status, exc.message) from None
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
    """One thread that serves every handler's lookups: it takes the requests waiting, fewest queries first, up
    to ``max_queries`` queries, runs them as one index call at the largest ``topk`` with its queries scored on
    all cores, and hands each request its own rows. Fewest first: a one-query lookup behind ten requests of 256
    queries waited 4.2-4.8 s for all of them in arrival order; it now joins the next batch."""

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
        self.queue.put((queries, topk, return_scores, slot, done.set))
        done.wait()
        if "error" in slot:
            raise slot["error"]
        return slot["result"]

    async def aretrieve(self, queries: list[str], topk: int, return_scores: bool) -> list[list[dict]]:
        """``retrieve`` for an event loop: the caller waits on a future, not on a thread of its own."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        slot: dict = {}

        def done():
            loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(None))

        self.queue.put((queries, topk, return_scores, slot, done))
        await fut
        if "error" in slot:
            raise slot["error"]
        return slot["result"]

    def _next_batch(self, waiting: list) -> list:
        """Everything queued joins ``waiting``; the batch is its smallest requests, up to ``max_queries``
        queries (one at least)."""
        import queue

        if not waiting:
            waiting.append(self.queue.get())
        while True:
            try:
                waiting.append(self.queue.get_nowait())
            except queue.Empty:
                break
        waiting.sort(key=lambda item: len(item[0]))  # stable: equal sizes keep their order
        batch, n = [], 0
        while waiting and (not batch or n + len(waiting[0][0]) <= self.max_queries):
            item = waiting.pop(0)
            batch.append(item)
            n += len(item[0])
        return batch

    def _serve(self) -> None:
        waiting: list = []
        while True:
            batch = self._next_batch(waiting)
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
                item[4]()


class RetrieverServer:
    """Serve an index from an event loop in a background thread (``start``; tests, benchmarks) or in
    the foreground (``serve_forever``; the CLI)."""

    def __init__(self, index: BM25Index, host: str = "127.0.0.1", port: int = 0, *, idle_timeout_s: float = 30.0,
                 max_connections: int = 1024, batch: bool = True, api_key: str | None = None):
        self.index = index
        self.api_key = api_key
        self.batcher = QueryBatcher(index) if batch else None
        self.host = host
        self.limits = web.ServerLimits(idle_timeout_s=idle_timeout_s, body_timeout_s=idle_timeout_s,
                                       max_connections=max_connections, max_body_bytes=MAX_BODY)
        self.sock = web.bind(host, port)
        self.port = self.sock.getsockname()[1]
        self.server: web.Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def refused(self) -> int:
        return self.server.refused if self.server is not None else 0

    def _app(self):
        from aiohttp import web as aio

        app = aio.Application(client_max_size=MAX_BODY, middlewares=[self._guard])
        app.router.add_get("/health", self._health)
        app.router.add_post("/retrieve", self._retrieve)
        app.router.add_route("*", "/{tail:.*}", self._nowhere)
        return app

    @staticmethod
    def _refusal(request, api_key: str | None):
        if api_key:
            if not web.same_key(request.headers.get("Authorization"), api_key):
                return _json(401, {"error": "missing or wrong API key: send Authorization: Bearer <key>"})
        elif not web.loopback_host(request.headers.get("Host")):
            return _json(403, {"error": f"Host {request.headers.get('Host', '')[:100]!r} is not a loopback name; a "
                                        f"retriever without an API key answers only requests to 127.0.0.1, localhost "
                                        f"or [::1] (start it with --api-key-env to serve other hosts)"})
        else:
            refused = web.browser_refusal(request)  # a web page the user opened cannot reach it blind
            if refused is not None:
                return _json(refused[0], {"error": refused[1]})
        return None

    @property
    def _guard(self):
        from aiohttp import web as aio

        @aio.middleware
        async def guard(request, handler):
            refused = self._refusal(request, self.api_key)
            if refused is not None:
                refused.force_close()  # its body was never read
                return refused
            return await handler(request)

        return guard

    async def _health(self, request):
        return _json(200, {"status": "ok", "documents": len(self.index)})

    async def _nowhere(self, request):
        return _json(404, {"error": f"no route {request.method} {request.path[:200]}; use GET /health or "
                                    f"POST /retrieve"})

    async def _retrieve(self, request):
        if request.content_length is None and request.headers.get("Transfer-Encoding") is None:
            return _json(411, {"error": "send a Content-Length header"})
        try:
            body = await web.read_body(request, self.limits)
        except web.BodyError as exc:  # the body was not read: the connection cannot carry another request
            resp = _json(exc.status, {"error": exc.message})
            resp.force_close()
            return resp
        try:
            queries, topk, scores = validate(body)
        except BadRequest as exc:
            return _json(exc.status, {"error": str(exc)})
        try:
            if self.batcher is not None:
                result = await self.batcher.aretrieve(queries, topk, scores)
            else:
                result = await asyncio.to_thread(self.index.retrieve, queries, topk, scores)
        except Exception as exc:  # never leave a client hanging
            return _json(500, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"})
        return _json(200, {"result": to_wire(result, scores)})

    async def _run(self, ready: threading.Event | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self.server = web.Server(self._app(), self.sock, self.limits)
        await self.server.start()
        if ready is not None:
            ready.set()
        try:
            await self._stopped.wait()
        finally:
            await self.server.stop()

    def start(self) -> "RetrieverServer":
        ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run(ready)), daemon=True,
                                       name="retriever-server")
        self.thread.start()
        if not ready.wait(30):
            raise RuntimeError("the retriever server did not start within 30 s")
        return self

    def serve_forever(self) -> None:
        asyncio.run(self._run())

    def stop(self) -> None:
        """Stop serving and drop kept-alive connections, as a killed server would."""
        if self.loop is not None and self._stopped is not None:
            self.loop.call_soon_threadsafe(self._stopped.set)
        if self.thread is not None:
            self.thread.join(timeout=10)
        self.sock.close()


def _json(status: int, payload: dict):
    from aiohttp import web as aio

    return aio.json_response(payload, status=status)


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
