"""An OpenAI-compatible gateway: outside programs reach masrl's agents as they would any server.

A program written with the ``openai`` client, LangGraph or any framework that speaks OpenAI's API
is given a base URL for its episode, ``http://127.0.0.1:PORT/rollout/<id>/v1``. Every request it
makes there names an agent (``model``, or the ``X-Masrl-Agent`` header) and becomes a call on that
episode's trace through the same ``WorkflowContext.call`` a masrl workflow uses: the agent's policy
or adapter, its batcher (batched with everything else in flight), the exact tokens sampled kept in
the worker, the agent's sampling settings (a request may lower ``max_tokens`` and add ``stop``
strings; its ``temperature`` is not what is trained, so training ignores it).

Routes (each also under ``/rollout/<id>``): ``POST /v1/chat/completions`` (``tools`` and
``tool_choice``; tool calls come back in OpenAI's format), ``POST /v1/completions`` (a raw prompt,
no chat template), ``GET /v1/models``. ``stream: true`` gets a 400 saying so. The server binds
127.0.0.1 unless told otherwise; with ``api_key`` every request needs ``Authorization: Bearer``.

Errors name what was wrong: 400 for bad JSON, a bad field (``messages[2].role``) or a prompt past
the model's context (naming the limit), 401 for a missing key, 404 for an unknown agent (listing
the agents) or rollout, 409 for a request to a rollout that has finished. A client that
disconnects has its call cancelled (it never reaches the trace); everyone else keeps being served.
Built on aiohttp.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from typing import Any, Callable

from masrl.errors import ContextOverflow, InfraError
from masrl.messages import RAW_ROLE
from masrl.trace import new_id

ROLES = ("system", "user", "assistant", "tool")


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of ``{type: text, text}`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest(400, f"{where} must be a string or a list of text parts", where)


def _message(m: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(400, f"{where} must be an object with 'role' and 'content'", where)
    role = m.get("role")
    if role not in ROLES:
        raise BadRequest(400, f"{where}.role: {role!r} is not one of {', '.join(ROLES)}", f"{where}.role")
    calls = m.get("tool_calls") or []
    content = m.get("content")
    if content is None and not (role == "assistant" and calls):
        raise BadRequest(400, f"{where}.content is missing", f"{where}.content")
    text = "" if content is None else _text(content, f"{where}.content")
    out = {"role": role, "content": text}
    for j, c in enumerate(calls):  # the assistant's earlier tool calls, in the tag format the model writes
        cid = str(c.get("id", "")) if isinstance(c, dict) else ""
        if cid.startswith("call_") and "_" in cid[5:]:  # ours: the call's exact completion replaces the message
            out["_call"] = cid[5:].rsplit("_", 1)[0]
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(400, f"{where}.tool_calls[{j}].function.name is missing", f"{where}.tool_calls[{j}]")
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            raise BadRequest(400, f"{where}.tool_calls[{j}].function.arguments is not JSON",
                             f"{where}.tool_calls[{j}]") from None
        out["content"] += (("\n" if out["content"] else "") + "<tool_call>"
                           + json.dumps({"name": fn["name"], "arguments": args}) + "</tool_call>")
    return out


def continued_call(trace, messages: list[dict]) -> tuple[list[dict], str | None]:
    """The messages with any assistant turn that was one of this episode's calls restored to that
    call's exact completion, and the latest call these messages continue (its messages, then its
    completion, then more), whose sampled ids the worker will reuse."""
    by_id = {c.call_id: c for c in trace.calls} if trace is not None else {}
    clean = []
    for m in messages:
        cid = m.get("_call")
        clean.append({"role": "assistant", "content": by_id[cid].completion} if cid in by_id
                     else {"role": m["role"], "content": m["content"]})
    for c in reversed(trace.calls if trace is not None else []):
        n = len(c.messages)
        if len(clean) > n + 1 and clean[:n] == c.messages and clean[n] == {"role": "assistant", "content": c.completion}:
            return clean, c.call_id
    return clean, None


def _tools(body: dict) -> list[dict]:
    tools = body.get("tools") or []
    if body.get("tool_choice") == "none":
        return []
    if not isinstance(tools, list):
        raise BadRequest(400, "tools must be a list of {type: function, function: {...}}", "tools")
    specs = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(400, f"tools[{i}].function.name is missing", f"tools[{i}]")
        specs.append(fn)
    return specs


def _limit(body: dict) -> dict:
    limit: dict = {}
    n = body.get("max_completion_tokens", body.get("max_tokens"))
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadRequest(400, f"max_tokens must be a positive integer, got {n!r}", "max_tokens")
        limit["max_new_tokens"] = n
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest(400, "stop must be a string or a list of strings", "stop")
        limit["stop"] = stop
    return limit


def parse_request(body: Any, agents: dict, *, chat: bool, agent: str | None = None) -> dict:
    """Validate a chat or completion request against the agents; returns the call's pieces."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    if body.get("stream"):
        raise BadRequest(400, "stream: true is not supported; send stream: false (masrl answers with the whole "
                              "completion)", "stream")
    if body.get("n", 1) != 1:
        raise BadRequest(400, "n must be 1 (one completion per request)", "n")
    name = agent or body.get("model")
    if name not in agents:
        raise BadRequest(404, f"model {name!r} is not an agent of this run; agents: {', '.join(agents)}", "model")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest(400, "messages must be a non-empty list", "messages")
        messages = [_message(m, i) for i, m in enumerate(msgs)]
        tools = _tools(body)
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise BadRequest(400, "prompt must be a non-empty string (one prompt per request)", "prompt")
        messages, tools = [{"role": RAW_ROLE, "content": prompt}], []
    return {"agent": name, "messages": messages, "tool_specs": tools, "limit": _limit(body)}


def post_rewards(trace, items: list) -> int:
    """Record posted rewards on the trace: the outcome (``trace.state["posted_outcome"]``) or a call's
    ``credit``, after checking every item (nothing is recorded when one is bad)."""
    import math

    by_id = {f"chatcmpl-{c.call_id}": c for c in trace.calls}
    todo = []
    for i, item in enumerate(items):
        where = f"[{i}]" if len(items) > 1 else "body"
        r = item.get("reward") if isinstance(item, dict) else None
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise BadRequest(400, f"{where}.reward must be a finite number, got {r!r}", f"{where}.reward")
        cid = item.get("id")
        if cid is not None and cid not in by_id:
            raise BadRequest(404, f"{where}.id: {cid!r} is not a completion of this rollout (ids are the responses' "
                                  f"'id' fields)", f"{where}.id")
        todo.append((by_id.get(cid), float(r)))
    for call, r in todo:
        if call is None:
            trace.state["posted_outcome"] = r
        else:
            call.credit = r
    return len(todo)


def chat_response(call, offered_tools: bool) -> dict:
    from masrl.tools.calls import parse_tool_calls

    message: dict = {"role": "assistant", "content": call.completion}
    finish = "length" if call.finish_reason == "length" else "stop"
    if offered_tools:
        parsed = parse_tool_calls(call.completion)
        if parsed.calls:
            message["content"] = parsed.text or None
            message["tool_calls"] = [{"id": f"call_{call.call_id}_{i}", "type": "function",
                                      "function": {"name": n, "arguments": json.dumps(a)}}
                                     for i, (n, a) in enumerate(parsed.calls)]
            finish = "tool_calls"
    return {"id": f"chatcmpl-{call.call_id}", "object": "chat.completion", "created": int(time.time()),
            "model": call.agent, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": _usage(call)}


def completion_response(call) -> dict:
    return {"id": f"cmpl-{call.call_id}", "object": "text_completion", "created": int(time.time()),
            "model": call.agent, "choices": [{"index": 0, "text": call.completion, "logprobs": None,
                                              "finish_reason": "length" if call.finish_reason == "length" else "stop"}],
            "usage": _usage(call)}


def _usage(call) -> dict:
    return {"prompt_tokens": call.n_prompt_tokens, "completion_tokens": call.n_completion_tokens,
            "total_tokens": call.n_prompt_tokens + call.n_completion_tokens}


class Gateway:
    """The HTTP server and the open rollouts (``rollout id -> WorkflowContext``)."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 free_context: Callable[[], Any] | None = None, keep_finished: int = 100_000):
        self.host, self.port, self.api_key = host, port, api_key
        self.free_context = free_context  # serving: requests outside any rollout get a throwaway context
        self.open_rollouts: dict[str, Any] = {}
        self.errors: dict[str, list[str]] = {}  # rollout -> infrastructure failures its requests met
        self.finished: OrderedDict[str, None] = OrderedDict()
        self.keep_finished = keep_finished
        self.served = 0
        self._runner = None
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> str:
        from aiohttp import web

        app = web.Application(middlewares=[self._auth], client_max_size=16 * 2**20)
        for prefix in ("", "/rollout/{rid}"):
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
        app.router.add_post("/rollout/{rid}/v1/rewards", self._rewards)
        app.router.add_post("/rollout/{rid}/v1/answer", self._answer)
        # handler_cancellation: a client that disconnects cancels its request (and so its call)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.loop = asyncio.get_running_loop()
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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
    async def _auth(self, app, handler):
        from aiohttp import web

        async def check(request):
            if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
                return web.json_response(_error(401, "missing or wrong API key: send Authorization: Bearer <key>"),
                                         status=401)
            return await handler(request)

        return check

    def _context(self, request):
        rid = request.match_info.get("rid") or request.headers.get("X-Masrl-Rollout")
        if rid is None:
            if self.free_context is None:
                raise BadRequest(400, "this gateway serves training episodes: send requests to the base URL masrl "
                                      "gave the episode (OPENAI_BASE_URL, .../rollout/<id>/v1)")
            return None, self.free_context()
        if rid in self.finished:
            raise BadRequest(409, f"rollout {rid} has finished; its trace is closed")
        ctx = self.open_rollouts.get(rid)
        if ctx is None:
            raise BadRequest(404, f"no rollout {rid} is open on this gateway")
        return rid, ctx

    async def _models(self, request):
        from aiohttp import web

        try:
            _, ctx = self._context(request)
        except BadRequest as exc:
            return web.json_response(_error(exc.status, exc.message, exc.param), status=exc.status)
        return web.json_response({"object": "list", "data": [{"id": a, "object": "model", "owned_by": "masrl"}
                                                             for a in ctx.agents]})

    async def _rewards(self, request):
        """``POST /rollout/<id>/v1/rewards``: ``{"reward": r}`` is the episode's outcome; ``{"id":
        "chatcmpl-...", "reward": r}`` a call's credit (paid by the ``credit`` reward); or a list."""
        from aiohttp import web

        try:
            _, ctx = self._context(request)
            body = await _json_body(request)
            posted = post_rewards(ctx.trace, body if isinstance(body, list) else [body])
        except BadRequest as exc:
            return web.json_response(_error(exc.status, exc.message, exc.param), status=exc.status)
        return web.json_response({"accepted": posted})

    async def _answer(self, request):
        """``POST /rollout/<id>/v1/answer`` ``{"answer": ...}``: the episode's final answer, for a
        program whose output is not its answer (it takes the place of what it prints or returns)."""
        from aiohttp import web

        try:
            _, ctx = self._context(request)
            body = await _json_body(request)
            if not isinstance(body, dict) or "answer" not in body:
                raise BadRequest(400, 'send {"answer": ...}', "answer")
            ctx.trace.state["posted_answer"] = body["answer"]
        except BadRequest as exc:
            return web.json_response(_error(exc.status, exc.message, exc.param), status=exc.status)
        return web.json_response({"accepted": 1})

    async def _chat(self, request):
        return await self._serve(request, chat=True)

    async def _completions(self, request):
        return await self._serve(request, chat=False)

    async def _serve(self, request, *, chat: bool):
        from aiohttp import web

        rid = None
        try:
            rid, ctx = self._context(request)
            body = await _json_body(request)
            req = parse_request(body, ctx.agents, chat=chat, agent=request.headers.get("X-Masrl-Agent"))
            if rid is None and isinstance(body.get("temperature"), (int, float)):  # serving: the request's choice
                ctx.temperature = float(body["temperature"])
            messages, extends = continued_call(ctx.trace, req["messages"])
            try:
                call = await ctx.call(req["agent"], messages, tool_specs=req["tool_specs"], limit=req["limit"],
                                      extends=extends)
            except ContextOverflow as exc:
                raise BadRequest(400, f"{exc}; shorten the messages or lower max_tokens", "messages") from None
        except BadRequest as exc:
            return web.json_response(_error(exc.status, exc.message, exc.param), status=exc.status)
        except InfraError as exc:  # the model or a worker failed: the episode fails with it
            if rid is not None:
                self.errors.setdefault(rid, []).append(str(exc))
            return web.json_response(_error(503, f"the model could not answer: {exc}"), status=503)
        self.served += 1
        return web.json_response(chat_response(call, bool(req["tool_specs"])) if chat else completion_response(call))


async def _json_body(request):
    """The request's JSON body, or a 400 that says it is not JSON."""
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the body is not valid JSON ({exc})") from None


def _error(status: int, message: str, param: str | None = None) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            409: "conflict_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
