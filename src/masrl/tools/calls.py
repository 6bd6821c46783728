"""Tool calls the model writes itself.

Rendering: a call made with ``tools=[...]`` (``ctx.call(agent, messages, tools=["search"])``)
reaches the worker with the tools' JSON specs. Where the tokenizer's chat template renders
``tools`` (Qwen2.5/3, Llama 3.1+, Hermes-style templates), they go to ``apply_chat_template(tools=...)``
and ``role: tool`` messages are rendered by the template. Otherwise (SmolLM2, plain ChatML) masrl
describes the tools in the system message in the tag format below, and shows each ``role: tool``
message as a user message wrapped in ``<tool_response></tool_response>``.

The tag format (the one Qwen and Hermes templates ask for, so one parser serves both)::

    <tool_call>{"name": "search", "arguments": {"query": "founder of Vexora Labs"}}</tool_call>

``parse_tool_calls`` reads every ``<tool_call>`` block (and, failing that, a completion that is
one bare JSON object with ``name`` and ``arguments``/``parameters``, as Llama 3 writes them).
A block that is not JSON or lacks a name is reported in ``errors``: the model's mistake, to show
it and to score, never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@dataclass
class ParsedToolCalls:
    calls: list[tuple[str, dict]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    text: str = ""  # the completion with the tool-call blocks removed


def _one(obj) -> tuple[str, dict] | str:
    if not isinstance(obj, dict):
        return "a tool call must be a JSON object with 'name' and 'arguments'"
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI's wire format sends arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"the arguments of tool call '{name}' are not JSON"
    if not isinstance(name, str) or not name:
        return "a tool call needs a 'name' (a string)"
    if not isinstance(args, dict):
        return f"the arguments of tool call '{name}' must be a JSON object"
    return name, args


def parse_tool_calls(text: str) -> ParsedToolCalls:
    out = ParsedToolCalls(text=_BLOCK.sub("", text).strip())
    blocks = _BLOCK.findall(text)
    if not blocks:
        stripped = text.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            try:
                obj = json.loads(stripped)
            except json.JSONDecodeError:
                return out
            if isinstance(obj, dict) and "name" in obj and ("arguments" in obj or "parameters" in obj):
                got = _one(obj)
                if isinstance(got, str):
                    out.errors.append(got)
                else:
                    out.calls.append(got)
                    out.text = ""
        return out
    for raw in blocks:
        try:
            obj = json.loads(raw.strip())
        except json.JSONDecodeError as exc:
            out.errors.append(f"a <tool_call> block is not valid JSON ({exc.msg})")
            continue
        got = _one(obj)
        if isinstance(got, str):
            out.errors.append(got)
        else:
            out.calls.append(got)
    return out


def template_renders_tools(tokenizer) -> bool:
    """Whether the chat template uses the ``tools`` variable (else masrl writes the tag format)."""
    tpl = getattr(tokenizer, "chat_template", None)
    if isinstance(tpl, dict):
        tpl = tpl.get("tool_use") or tpl.get("default") or ""
    return bool(tpl) and re.search(r"\btools\b", tpl) is not None


def tools_instruction(specs: list[dict]) -> str:
    lines = ["You can call these tools:"]
    for s in specs:
        f = s.get("function", s)
        lines.append(json.dumps({"name": f["name"], "description": f.get("description", ""),
                                 "parameters": f.get("parameters", {})}))
    lines.append('To call a tool, write <tool_call>{"name": NAME, "arguments": {...}}</tool_call>. '
                 "Its result comes back in <tool_response></tool_response>.")
    return "\n".join(lines)


def with_tools_in_text(messages: list[dict], specs: list[dict]) -> list[dict]:
    """The tag-format rendering for templates without tools: tool descriptions in the system
    message, tool results as user messages in ``<tool_response>``, the assistant's tool calls kept
    as the text it wrote."""
    out = [dict(m) for m in messages]
    note = tools_instruction(specs) if specs else ""
    if note:
        if out and out[0].get("role") == "system":
            out[0]["content"] = f"{out[0]['content']}\n{note}"
        else:
            out.insert(0, {"role": "system", "content": note})
    for m in out:
        if m.get("role") == "tool":
            m["role"] = "user"
            m["content"] = f"<tool_response>{m['content']}</tool_response>"
            m.pop("name", None)
            m.pop("tool_call_id", None)
    return out
