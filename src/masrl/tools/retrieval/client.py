"""Retriever clients with one interface: ``retrieve(queries, topk, return_scores)``.

``RetrieverClient`` talks to one or more HTTP endpoints: a per-request timeout, retries with
exponential backoff, failover to the next endpoint, and an endpoint that failed is skipped
for ``dead_for_s`` (then tried again). A response that is not the expected shape counts as a
failure. Servers answer in Search-R1's shape (``wire``); documents come back flat:
``{"id", "contents"[, "score"]}``. When every endpoint fails, ``RetrievalError`` lists what each one did; a workflow
calling it through ``ctx.tool`` records that as a tool failure.

``LocalRetriever`` searches an index in-process (no server): the embedded default.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import time
import urllib.parse
from pathlib import Path

from masrl.tools.retrieval.index import BM25Index
from masrl.tools.retrieval.wire import from_wire


class RetrievalError(RuntimeError):
    pass


class RequestRejected(RetrievalError):
    """The server answered 4xx: the request itself is bad; retrying elsewhere will not help."""


class RetrieverClient:
    def __init__(self, endpoints: list[str] | str, *, timeout_s: float = 5.0, retries: int = 1,
                 backoff_s: float = 0.1, dead_for_s: float = 30.0, api_key: str | None = None):
        self.endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not self.endpoints:
            raise ValueError("RetrieverClient needs at least one endpoint URL")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.dead_for_s = dead_for_s
        self.headers = {"Content-Type": "application/json"}
        if api_key:  # a server with a key answers any host; one without answers loopback names only
            self.headers["Authorization"] = f"Bearer {api_key}"
        self._dead_until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._local = threading.local()  # one keep-alive connection per thread and endpoint

    def _order(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            alive = [e for e in self.endpoints if self._dead_until.get(e, 0) <= now]
            dead = [e for e in self.endpoints if e not in alive]
        return alive + dead  # dead ones last: tried only if every live one fails

    def _mark(self, endpoint: str, ok: bool) -> None:
        with self._lock:
            if ok:
                self._dead_until.pop(endpoint, None)
            else:
                self._dead_until[endpoint] = time.monotonic() + self.dead_for_s

    def _post(self, endpoint: str, body: bytes) -> tuple[int, bytes]:
        conns = self._local.__dict__.setdefault("conns", {})
        u = urllib.parse.urlsplit(endpoint)
        path = (u.path.rstrip("/") or "") + "/retrieve"
        for fresh in (False, True):  # a kept-alive connection may have been closed by the server
            conn = conns.get(endpoint)
            if conn is None or fresh:
                if conn is not None:
                    conn.close()
                conn = conns[endpoint] = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=self.timeout_s)
            try:
                conn.request("POST", path, body=body, headers=self.headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    conn.close()
                    conns.pop(endpoint, None)
                return resp.status, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
                conn.close()
                conns.pop(endpoint, None)
                if fresh:
                    raise exc
            except Exception:
                conn.close()
                conns.pop(endpoint, None)
                raise
        raise AssertionError("unreachable")

    def retrieve(self, queries: list[str], topk: int = 3, return_scores: bool = True) -> list[list[dict]]:
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": return_scores}).encode()
        failures = []
        for endpoint in self._order():
            for attempt in range(self.retries + 1):
                try:
                    status, data = self._post(endpoint, body)
                    if 400 <= status < 500:
                        try:
                            msg = json.loads(data).get("error", data[:200])
                        except (json.JSONDecodeError, AttributeError):
                            msg = data[:200]
                        raise RequestRejected(f"{endpoint} rejected the request ({status}): {msg}")
                    if status != 200:
                        raise ValueError(f"HTTP {status}")
                    result = from_wire(json.loads(data), len(queries))
                    self._mark(endpoint, True)
                    return result
                except RequestRejected:
                    raise
                except (OSError, http.client.HTTPException, ValueError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                    if attempt < self.retries:
                        time.sleep(self.backoff_s * (2**attempt))
            failures.append(f"{endpoint}: {last}")
            self._mark(endpoint, False)
        raise RetrievalError(f"all {len(self.endpoints)} retriever endpoint(s) failed: " + "; ".join(failures))

    async def aretrieve(self, queries: list[str], topk: int = 3, return_scores: bool = True) -> list[list[dict]]:
        return await asyncio.get_running_loop().run_in_executor(None, self.retrieve, queries, topk, return_scores)


class LocalRetriever:
    """The same interface over an in-process index: no server needed."""

    def __init__(self, corpus: str | Path):
        self.index = BM25Index.load(corpus)

    def retrieve(self, queries: list[str], topk: int = 3, return_scores: bool = True) -> list[list[dict]]:
        if not queries:
            raise RetrievalError("no queries given")
        return self.index.retrieve(list(queries), topk, return_scores)

    async def aretrieve(self, queries: list[str], topk: int = 3, return_scores: bool = True) -> list[list[dict]]:
        """Scores in a worker thread, so a search never stalls the event loop."""
        return await asyncio.to_thread(self.retrieve, queries, topk, return_scores)
