"""The OpenAI wire format as the gateway speaks it: every field of a request checked, and the
response shapes.

Each request is validated on its own before it becomes a call (``parse_request``): types, finite
ranges, tool schemas, the text of every message (a lone UTF-16 surrogate, which JSON can carry and
no tokenizer takes, is refused here). A parameter the gateway does not act on is refused by name
unless it is one that changes nothing (``user``, ``metadata``, a zero penalty, ...), so a client
never believes a setting took effect when it did not. ``docs/gateway.md`` lists every answer.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from masrl.messages import RAW_ROLE
from masrl.web import server as web

ROLES = ("system", "developer", "user", "assistant", "tool")
COMMON = {"model", "stream", "stream_options", "n", "max_tokens", "max_completion_tokens", "stop", "temperature",
          "top_p", "logprobs", "top_logprobs", "seed"}
CHAT = COMMON | {"messages", "tools", "tool_choice", "parallel_tool_calls"}
COMPLETION = COMMON | {"prompt", "echo", "suffix", "best_of"}
# accepted and ignored: they change nothing about the answer
HARMLESS = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
# accepted only at the value that changes nothing
NEUTRAL = {
    "presence_penalty": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0,
    "frequency_penalty": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0,
    "logit_bias": lambda v: v == {},
    "echo": lambda v: v is False,
    "suffix": lambda v: v == "",
    "best_of": lambda v: v == 1 and not isinstance(v, bool),
    "response_format": lambda v: v == {"type": "text"},
}
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
# counted before any per-item work: a request past one is refused whole (docs/gateway.md lists them)
MAX_MESSAGES = 2048  # messages of a chat request
MAX_PARTS = 256  # content parts of one message
MAX_TOOL_CALLS = 128  # tool calls of one assistant message
MAX_TOOLS = 128  # tools offered in one request
MAX_NESTING = 32  # lists and objects inside a tool call's arguments or a tool's parameters
MAX_FIELDS = 64  # top-level fields of a request
MAX_ALL_TOOL_CALLS = 1024  # tool calls of all of a request's messages together
MAX_TOOL_ITEMS = 20_000  # values in all the offered tools' schemas together (names, types, properties, ...)
MAX_REWARDS = 4096  # items of one POST to /rewards
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def _valid_text(text: str, where: str) -> str:
    """Text a tokenizer can take: no lone UTF-16 surrogates (JSON's ``\\ud800`` decodes to one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(400, f"{where} holds a lone UTF-16 surrogate ({text[exc.start]!r} at character {exc.start}); "
                              f"send valid Unicode", where) from None
    return text


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or OpenAI's list of ``{type: text, text}`` parts."""
    if isinstance(content, str):
        return _valid_text(content, where)
    if isinstance(content, list) and len(content) > MAX_PARTS:
        raise BadRequest(400, f"{where} has {len(content):,} parts; at most {MAX_PARTS}", where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return _valid_text("".join(p["text"] for p in content), where)
    raise BadRequest(400, f"{where} must be a string or a list of {{type: text, text: string}} parts", where)


def _tool_call(c: Any, where: str) -> tuple[str | None, str]:
    """One of an assistant message's ``tool_calls``: (our call id, its tag-format text)."""
    if not isinstance(c, dict):
        raise BadRequest(400, f"{where} must be an object", where)
    cid = c.get("id", "")
    if not isinstance(cid, str):
        raise BadRequest(400, f"{where}.id must be a string", f"{where}.id")
    fn = c.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise BadRequest(400, f"{where}.function.name is missing", where)
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = web.load_json(_valid_text(args, f"{where}.function.arguments").encode(),
                                 f"{where}.function.arguments")
        except web.BodyError as exc:
            raise BadRequest(400, exc.message, f"{where}.function.arguments") from None
    _shallow(args, f"{where}.function.arguments")
    ours = cid[5:].rsplit("_", 1)[0] if cid.startswith("call_") and "_" in cid[5:] else None
    return ours, "<tool_call>" + json.dumps({"name": _valid_text(fn["name"], f"{where}.function.name"),
                                             "arguments": args}) + "</tool_call>"


def _shallow(value: Any, where: str) -> None:
    if web.nesting(value, MAX_NESTING) > MAX_NESTING:
        raise BadRequest(400, f"{where} nests lists or objects more than {MAX_NESTING} deep", where)


def _message(m: Any, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise BadRequest(400, f"{where} must be an object with 'role' and 'content'", where)
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise BadRequest(400, f"{where}.role: {role!r} is not one of {', '.join(ROLES)}", f"{where}.role")
    calls = m.get("tool_calls")
    if calls is not None and (role != "assistant" or not isinstance(calls, list)):
        raise BadRequest(400, f"{where}.tool_calls must be a list, on an assistant message", f"{where}.tool_calls")
    if calls and len(calls) > MAX_TOOL_CALLS:
        raise BadRequest(400, f"{where}.tool_calls has {len(calls):,} calls; at most {MAX_TOOL_CALLS}",
                         f"{where}.tool_calls")
    content = m.get("content")
    if content is None and not (role == "assistant" and calls):
        raise BadRequest(400, f"{where}.content is missing", f"{where}.content")
    out = {"role": "system" if role == "developer" else role,  # what current clients call the system prompt
           "content": "" if content is None else _text(content, f"{where}.content")}
    for j, c in enumerate(calls or []):  # the assistant's earlier tool calls, in the tag format the model writes
        ours, tag = _tool_call(c, f"{where}.tool_calls[{j}]")
        if ours is not None:  # ours: the call's exact completion replaces the message
            out["_call"] = ours
        out["content"] += ("\n" if out["content"] else "") + tag
    return out


def _tool(offered: Any, where: str) -> dict:
    """One offered tool, checked: its function's name, description and parameter schema."""
    if (not isinstance(offered, dict) or offered.get("type", "function") != "function"
            or not isinstance(offered.get("function"), dict)):
        raise BadRequest(400, f"{where} must be {{type: function, function: {{name, description, parameters}}}}", where)
    fn = offered["function"]
    if not isinstance(fn.get("name"), str) or not TOOL_NAME.match(fn["name"]):
        raise BadRequest(400, f"{where}.function.name must be 1-64 letters, digits, _ or -", f"{where}.function.name")
    if not isinstance(fn.get("description", ""), str):
        raise BadRequest(400, f"{where}.function.description must be a string", f"{where}.function.description")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if (not isinstance(params, dict) or params.get("type", "object") != "object"
            or not isinstance(params.get("properties", {}), dict)
            or not all(isinstance(v, dict) for v in params.get("properties", {}).values())):
        raise BadRequest(400, f"{where}.function.parameters must be a JSON Schema object ({{type: object, "
                              f"properties: {{name: {{...}}}}}})", f"{where}.function.parameters")
    _shallow(params, f"{where}.function.parameters")
    _valid_text(json.dumps(fn, ensure_ascii=False), where)
    return fn


def _tools(body: dict) -> list[dict]:
    """The request's tool specs, checked; none with ``tool_choice: none``."""
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise BadRequest(400, f"tool_choice {choice!r} is not supported: masrl does not constrain decoding to a tool "
                              f"call; send 'auto' (the model decides) or 'none'", "tool_choice")
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise BadRequest(400, "tools must be a list of {type: function, function: {...}}", "tools")
    if len(tools) > MAX_TOOLS:
        raise BadRequest(400, f"tools has {len(tools):,} tools; at most {MAX_TOOLS}", "tools")
    specs = [_tool(t, f"tools[{i}]") for i, t in enumerate(tools)]
    if choice == "none":
        return []
    return specs


def _number(body: dict, key: str, low: float, high: float, *, low_open: bool = False) -> float | None:
    """A finite number in its range (NaN, infinities, huge integers and booleans refused)."""
    v = body.get(key)
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (low < v if low_open else low <= v) and v <= high
    if not ok:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        raise BadRequest(400, f"{key} must be a number in {span}, got {shown}", key)
    return float(v)


def _limit(body: dict) -> dict:
    """What a request may narrow: ``max_tokens`` (no more than the agent's own) and ``stop``."""
    limit: dict = {}
    n = body.get("max_completion_tokens", body.get("max_tokens"))
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadRequest(400, f"max_tokens must be a positive integer, got {n!r}", "max_tokens")
        limit["max_new_tokens"] = n
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if (not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop)
                or not 1 <= len(stop) <= MAX_STOP):
            raise BadRequest(400, f"stop must be a non-empty string or a list of 1-{MAX_STOP} non-empty strings", "stop")
        limit["stop"] = [_valid_text(s, "stop") for s in stop]
    return limit


def _logprobs(body: dict, chat: bool) -> int | None:
    """``None``: no logprobs; 0: the sampled tokens'; k: and the k likeliest at each position."""
    if chat:
        want, top = body.get("logprobs"), body.get("top_logprobs")
        if want is not None and not isinstance(want, bool):
            raise BadRequest(400, "logprobs must be true or false", "logprobs")
        if top is not None:
            if not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS:
                raise BadRequest(400, f"top_logprobs must be an integer from 0 to {MAX_TOP_LOGPROBS}", "top_logprobs")
            if not want:
                raise BadRequest(400, "top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if want else None
    k = body.get("logprobs")  # the completions API: an integer, the number of alternatives
    if k is None:
        return None
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 5:
        raise BadRequest(400, "logprobs must be an integer from 0 to 5 on /v1/completions", "logprobs")
    return k


def _known_fields(body: dict, chat: bool) -> None:
    if len(body) > MAX_FIELDS:
        raise BadRequest(400, f"the request has {len(body):,} fields; at most {MAX_FIELDS}")
    allowed = CHAT if chat else COMPLETION
    route = "/v1/chat/completions" if chat else "/v1/completions"
    for key, value in body.items():
        if key in NEUTRAL:
            if value is not None and not NEUTRAL[key](value):
                raise BadRequest(400, f"{key} {json.dumps(value)[:60]} is not supported (masrl samples with the agent's "
                                      f"settings); leave it out", key)
        elif key not in allowed and key not in HARMLESS:
            raise BadRequest(400, f"unknown parameter {str(key)[:60]!r} for {route}; supported: "
                                  f"{', '.join(sorted(allowed - set(NEUTRAL)))}", str(key)[:60])


def parse_request(body: Any, agents: dict, *, chat: bool, agent: str | None = None) -> dict:
    """Validate a chat or completion request against the agents; returns the call's pieces."""
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    _known_fields(body, chat)
    _one_whole_answer(body)
    name = agent if agent is not None else body.get("model")
    if not isinstance(name, str):
        raise BadRequest(400, f"model must be a string naming an agent ({', '.join(agents)}), got "
                              f"{type(name).__name__}", "model")
    if name not in agents:
        raise BadRequest(404, f"model {name[:100]!r} is not an agent of this run; agents: {', '.join(agents)}", "model")
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest(400, "messages must be a non-empty list", "messages")
        if len(msgs) > MAX_MESSAGES:
            raise BadRequest(400, f"messages has {len(msgs):,} messages; at most {MAX_MESSAGES} in one request",
                             "messages")
        _counted_before_checked(msgs, body.get("tools"))
        messages, tools = [_message(m, i) for i, m in enumerate(msgs)], _tools(body)
    else:
        messages, tools = [{"role": RAW_ROLE, "content": _prompt(body.get("prompt"))}], []
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**63):
        raise BadRequest(400, "seed must be a non-negative integer below 2**63", "seed")
    return {"agent": name, "messages": messages, "tool_specs": tools, "limit": _limit(body),
            "temperature": _number(body, "temperature", 0, 2), "top_p": _number(body, "top_p", 0, 1, low_open=True),
            "logprobs": _logprobs(body, chat), "seed": seed, "stream": _stream(body)}


def _counted_before_checked(msgs: list, tools: Any) -> None:
    """What costs, counted over the whole request before any item is checked: the tool calls of every message
    together, and every value of every offered tool's schema together (a cap per message or per tool let 262k
    tool calls, or 128 tools of 10k parameters, through to be checked one by one)."""
    calls = sum(len(m["tool_calls"]) for m in msgs if isinstance(m, dict) and isinstance(m.get("tool_calls"), list))
    if calls > MAX_ALL_TOOL_CALLS:
        raise BadRequest(400, f"the messages hold {calls:,} tool calls; at most {MAX_ALL_TOOL_CALLS} in one request",
                         "messages")
    if isinstance(tools, list) and web.count_values(tools, MAX_TOOL_ITEMS) > MAX_TOOL_ITEMS:
        raise BadRequest(400, f"the tools' schemas hold more than {MAX_TOOL_ITEMS:,} values together; offer fewer "
                              f"or smaller tools", "tools")


def _stream(body: dict) -> dict | None:
    """``stream: true``: the whole completion is sent as server-sent events once it is sampled (the chunks a
    streaming client reads, then ``[DONE]``); returns the stream's options (``include_usage``), or None."""
    stream, options = body.get("stream"), body.get("stream_options")
    if stream not in (None, True, False):
        raise BadRequest(400, "stream must be true or false", "stream")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}
                                or options.get("include_usage") not in (None, True, False)):
        raise BadRequest(400, 'stream_options takes {"include_usage": true|false}', "stream_options")
    return {"include_usage": bool((options or {}).get("include_usage"))} if stream else None


def _one_whole_answer(body: dict) -> None:
    """One completion per request (n = 1)."""
    if body.get("n", 1) != 1 or isinstance(body.get("n"), bool):
        raise BadRequest(400, "n must be 1 (one completion per request)", "n")
    if body.get("parallel_tool_calls") not in (None, True, False):
        raise BadRequest(400, "parallel_tool_calls must be true or false", "parallel_tool_calls")


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest(400, "prompt must be a non-empty string (one prompt per request)", "prompt")
    return _valid_text(prompt, "prompt")


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


def post_rewards(trace, items: list) -> int:
    """Record posted rewards on the trace: the outcome (``trace.state["posted_outcome"]``) or a call's
    ``credit``, after checking every item (nothing is recorded when one is bad)."""
    if len(items) > MAX_REWARDS:
        raise BadRequest(400, f"{len(items):,} rewards in one request; at most {MAX_REWARDS}")
    by_id = {f"chatcmpl-{c.call_id}": c for c in trace.calls}
    todo = []
    for i, item in enumerate(items):
        where = f"[{i}]" if len(items) > 1 else "body"
        r = item.get("reward") if isinstance(item, dict) else None
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not -1e9 <= r <= 1e9 or not math.isfinite(r):
            raise BadRequest(400, f"{where}.reward must be a finite number, got {r!r}"[:200], f"{where}.reward")
        cid = item.get("id")
        if cid is not None and (not isinstance(cid, str) or cid not in by_id):
            raise BadRequest(404, f"{where}.id: {cid!r} is not a completion of this rollout (ids are the responses' "
                                  f"'id' fields)"[:300], f"{where}.id")
        todo.append((by_id.get(cid), float(r)))
    for call, r in todo:
        if call is None:
            trace.state["posted_outcome"] = r
        else:
            call.credit = r
    return len(todo)


def _chat_logprobs(call) -> dict | None:
    if call.token_logprobs is None:
        return None
    return {"content": call.token_logprobs, "refusal": None}


def _completion_logprobs(call) -> dict | None:
    if call.token_logprobs is None:
        return None
    rows, offsets, at = call.token_logprobs, [], 0
    for r in rows:
        offsets.append(at)
        at += len(r["token"])
    return {"tokens": [r["token"] for r in rows], "token_logprobs": [r["logprob"] for r in rows],
            "top_logprobs": [{t["token"]: t["logprob"] for t in r["top_logprobs"]} or None for r in rows],
            "text_offset": offsets}


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
            "model": call.agent, "choices": [{"index": 0, "message": message, "finish_reason": finish,
                                              "logprobs": _chat_logprobs(call)}],
            "usage": _usage(call)}


def completion_response(call) -> dict:
    return {"id": f"cmpl-{call.call_id}", "object": "text_completion", "created": int(time.time()),
            "model": call.agent, "choices": [{"index": 0, "text": call.completion, "logprobs": _completion_logprobs(call),
                                              "finish_reason": "length" if call.finish_reason == "length" else "stop"}],
            "usage": _usage(call)}


def stream_events(response: dict, include_usage: bool) -> list[bytes]:
    """A whole chat or text completion as the server-sent events of a stream: one chunk with all of it, one
    with its finish reason, the usage when asked, then ``[DONE]``."""
    chat = response["object"] == "chat.completion"
    head = {"id": response["id"], "object": "chat.completion.chunk" if chat else "text_completion",
            "created": response["created"], "model": response["model"]}
    choice = response["choices"][0]
    if chat:
        delta = {k: v for k, v in choice["message"].items() if v is not None}
        if "tool_calls" in delta:
            delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(delta["tool_calls"])]
        first = {"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
        last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]}
    else:
        first = {"index": 0, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None}
        last = {"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]}
    chunks = [dict(head, choices=[first]), dict(head, choices=[last])]
    if include_usage:
        chunks.append(dict(head, choices=[], usage=response["usage"]))
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def _usage(call) -> dict:
    return {"prompt_tokens": call.n_prompt_tokens, "completion_tokens": call.n_completion_tokens,
            "total_tokens": call.n_prompt_tokens + call.n_completion_tokens}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
            408: "timeout_error", 409: "conflict_error", 413: "invalid_request_error"}.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
