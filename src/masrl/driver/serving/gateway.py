"""An OpenAI-compatible gateway: outside programs reach masrl's agents as they would any server.

A program written with the ``openai`` client, LangGraph or any framework that speaks OpenAI's API
is given a base URL for its episode, ``http://127.0.0.1:PORT/rollout/<id>/v1``. Every request it
makes there names an agent (``model``, or the ``X-Masrl-Agent`` header) and becomes a call on that
episode's trace through the same ``WorkflowContext.call`` a masrl workflow uses: the agent's policy
or adapter, its batcher (batched with everything else in flight), the exact tokens sampled kept in
the worker, the agent's sampling settings (a request may lower ``max_tokens`` and add ``stop``
strings; its ``temperature``, ``top_p`` and ``seed`` are not what is trained, so training ignores
them; ``masrl serve`` honours them).

Routes (each also under ``/rollout/<id>``): ``POST /v1/chat/completions`` (``tools`` and
``tool_choice``; tool calls come back in OpenAI's format; ``logprobs``/``top_logprobs``; ``stream: true``
answers with the whole completion as server-sent events once it is sampled),
``POST /v1/completions`` (a raw prompt, no chat template), ``GET /v1/models``.

Every request is checked on its own (``wire.parse_request``) and becomes its own call: a request
that fails (bad JSON, a bad field, a prompt that does not tokenise or fit) gets a 4xx naming the
problem and never touches another request, even one in the same engine batch. The server runs on
``masrl.web.server`` (read timeouts, a connection cap, a body cap, no version header); it binds 127.0.0.1
unless told otherwise; with ``api_key`` every request needs ``Authorization: Bearer`` (compared in
constant time), and without one only requests addressed to a loopback name are answered (a web
page cannot reach it through DNS rebinding). A client that disconnects has its call cancelled (it
never reaches the trace). ``docs/gateway.md`` lists every answer.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Callable

from masrl.driver.serving.wire import (
    BadRequest,
    chat_response,
    completion_response,
    continued_call,
    error_body,
    parse_request,
    post_rewards,
    stream_events,
)
from masrl.errors import ContextOverflow, InfraError, PromptError
from masrl.trace import new_id
from masrl.web import server as web

BIG_BODY = 256 * 1024  # bodies past this are parsed and checked off the event loop


class Gateway:
    """The HTTP server and the open rollouts (``rollout id -> WorkflowContext``)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 free_context: Callable[[], Any] | None = None, keep_finished: int = 100_000,
                 limits: web.ServerLimits | None = None, sock=None):
        self.host, self.port, self.api_key = host, port, api_key
        self.free_context = free_context  # serving: requests outside any rollout get a throwaway context
        self.limits = limits or web.ServerLimits()
        self.sock = sock  # a socket bound already (``masrl serve`` binds before any model loads)
        self.open_rollouts: dict[str, Any] = {}
        self.errors: dict[str, list[str]] = {}  # rollout -> infrastructure failures its requests met
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.keep_finished = keep_finished
        self.served = 0
        self.server: web.Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> str:
        from aiohttp import web as aio

        app = aio.Application(middlewares=[self._guard], client_max_size=self.limits.max_body_bytes)
        for prefix in ("", "/rollout/{rid}"):
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
        app.router.add_post("/rollout/{rid}/v1/rewards", self._rewards)
        app.router.add_post("/rollout/{rid}/v1/answer", self._answer)
        self.server = web.Server(app, self.sock or web.bind(self.host, self.port), self.limits,
                                 error_shape=lambda status, message: error_body(status, message))
        await self.server.start()
        self.port = self.server.port
        self.loop = asyncio.get_running_loop()
        return self.url

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None

    # -- rollouts ----------------------------------------------------------------------------
    def open(self, ctx) -> tuple[str, str]:
        """Register an episode; returns its id and the base URL its program talks to."""
        rid = new_id("rollout")
        self.open_rollouts[rid] = ctx
        return rid, f"{self.url}/rollout/{rid}/v1"

    def finish(self, rid: str) -> list[str]:
        """Close an episode: later requests for it get 409. Returns the infrastructure errors its
        requests met (a failed call fails the episode, as it would a workflow)."""
        self.open_rollouts.pop(rid, None)
        self.finished[rid] = None
        while len(self.finished) > self.keep_finished:
            self.finished.popitem(last=False)
        return self.errors.pop(rid, [])

    # -- HTTP --------------------------------------------------------------------------------
    async def _guard(self, app, handler):
        """Who may ask (the key, or a loopback Host without one), and the OpenAI error shape for a request's
        own failure (a 4xx); anything else reaches ``masrl.web.server``'s JSON answer (a 500 without internals)."""

        async def guarded(request):
            try:
                if self.api_key:
                    if not web.same_key(request.headers.get("Authorization"), self.api_key):
                        return _answer(401, "missing or wrong API key: send Authorization: Bearer <key>")
                elif not web.loopback_host(request.headers.get("Host")):
                    return _answer(403, f"Host {request.headers.get('Host', '')[:100]!r} is not a loopback name; a "
                                        f"gateway without an API key answers only requests to 127.0.0.1, localhost or "
                                        f"[::1] (give it a key to serve other hosts)")
                else:
                    refused = web.browser_refusal(request)  # a web page the user opened cannot reach it blind
                    if refused is not None:
                        return _answer(*refused)
                return await handler(request)
            except BadRequest as exc:
                return _answer(exc.status, exc.message, exc.param)

        return guarded

    def _context(self, request):
        rid = request.match_info.get("rid") or request.headers.get("X-Masrl-Rollout")
        if rid is None:
            if self.free_context is None:
                raise BadRequest(400, "this gateway serves training episodes: send requests to the base URL masrl "
                                      "gave the episode (OPENAI_BASE_URL, .../rollout/<id>/v1)")
            return None, self.free_context()
        if rid in self.finished:
            raise BadRequest(409, f"rollout {rid[:80]} has finished; its trace is closed")
        ctx = self.open_rollouts.get(rid)
        if ctx is None:
            raise BadRequest(404, f"no rollout {rid[:80]} is open on this gateway")
        return rid, ctx

    async def _json(self, request):
        """The request's JSON body within the server's limits, or a 4xx that says why not."""
        try:
            raw = await web.read_body(request, self.limits)
            request["masrl_big"] = len(raw) > BIG_BODY
            if request["masrl_big"]:
                return await asyncio.to_thread(web.load_json, raw)
            return web.load_json(raw)
        except web.BodyError as exc:
            raise BadRequest(exc.status, exc.message) from None

    async def _models(self, request):
        _, ctx = self._context(request)
        return _json_response({"object": "list", "data": [{"id": a, "object": "model", "owned_by": "masrl"}
                                                          for a in ctx.agents]})

    async def _rewards(self, request):
        """``POST /rollout/<id>/v1/rewards``: ``{"reward": r}`` is the episode's outcome; ``{"id":
        "chatcmpl-...", "reward": r}`` a call's credit (paid by the ``credit`` reward); or a list."""
        _, ctx = self._context(request)
        body = await self._json(request)
        return _json_response({"accepted": post_rewards(ctx.trace, body if isinstance(body, list) else [body])})

    async def _answer(self, request):
        """``POST /rollout/<id>/v1/answer`` ``{"answer": ...}``: the episode's final answer, for a
        program whose output is not its answer (it takes the place of what it prints or returns)."""
        _, ctx = self._context(request)
        body = await self._json(request)
        if not isinstance(body, dict) or "answer" not in body:
            raise BadRequest(400, 'send {"answer": ...}', "answer")
        ctx.trace.state["posted_answer"] = body["answer"]
        return _json_response({"accepted": 1})

    async def _chat(self, request):
        return await self._serve(request, chat=True)

    async def _completions(self, request):
        return await self._serve(request, chat=False)

    async def _serve(self, request, *, chat: bool):
        rid, ctx = self._context(request)
        body = await self._json(request)
        agent = request.headers.get("X-Masrl-Agent")
        if request.get("masrl_big"):  # each of its items checked on a thread: the loop keeps serving meanwhile
            req = await asyncio.to_thread(parse_request, body, ctx.agents, chat=chat, agent=agent)
        else:
            req = parse_request(body, ctx.agents, chat=chat, agent=agent)
        if rid is None:  # serving: the request's own sampling choices
            ctx.temperature, ctx.top_p = req["temperature"], req["top_p"]
            if req["seed"] is not None:
                ctx.seed = req["seed"]
        messages, extends = continued_call(ctx.trace, req["messages"])
        try:
            call = await ctx.call(req["agent"], messages, tool_specs=req["tool_specs"], limit=req["limit"],
                                  extends=extends, logprobs=req["logprobs"])
        except ContextOverflow as exc:
            raise BadRequest(400, f"{exc}; shorten the messages or lower max_tokens", "messages") from None
        except PromptError as exc:  # this request's own prompt: nobody else's call is touched
            raise BadRequest(400, str(exc), "messages" if chat else "prompt") from None
        except InfraError as exc:  # the model or a worker failed: the episode fails with it
            if rid is not None:
                self.errors.setdefault(rid, []).append(str(exc))
            return _answer(503, f"the model could not answer: {exc}")
        self.served += 1
        answer = chat_response(call, bool(req["tool_specs"])) if chat else completion_response(call)
        if req["stream"] is None:
            return _json_response(answer)
        return await _event_stream(request, stream_events(answer, req["stream"]["include_usage"]))


async def _event_stream(request, events: list[bytes]):
    from aiohttp import web as aio

    resp = aio.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for event in events:
        await resp.write(event)
    await resp.write_eof()
    return resp


def _json_response(data: dict, status: int = 200):
    from aiohttp import web as aio

    return aio.json_response(data, status=status)


def _answer(status: int, message: str, param: str | None = None):
    resp = _json_response(error_body(status, message, param), status)
    if status in (401, 403, 408, 413):  # the body was not read whole: the connection cannot carry another request
        resp.force_close()
    return resp
