"""Which field of a dataset row holds what: the aliases that RL frameworks' formats use.

A row may be flat (``question``/``answer``) or laid out as verl's preprocessing writes parquet:
``data_source``, ``prompt`` (a list of chat messages), ``ability``, ``reward_model: {style,
ground_truth}``, ``extra_info: {split, index, question, answer, ...}``. Dotted names reach into
nested fields; the first alias present (not null, not blank) wins.
"""

from __future__ import annotations

import json
from typing import Any

QUESTION = ("question", "query", "problem", "prompt", "extra_info.question")
ANSWER = ("answer", "ground_truth", "target", "solution", "reward_model.ground_truth", "extra_info.answer")
TESTS = ("tests", "test_cases", "test", "input_output", "reward_model.ground_truth", "extra_info.tests")
STARTER = ("starter_code", "extra_info.starter_code")
ID = ("uid", "id", "task_id", "idx", "extra_info.index")
FN_NAME = ("fn_name", "extra_info.fn_name")


def lookup(row: dict, name: str) -> Any:
    node: Any = row
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, (list, dict)) and not v)


def first(row: dict, names: tuple[str, ...]) -> tuple[str | None, Any]:
    """``(name, value)`` of the first alias present in ``row``, or ``(None, None)``."""
    for name in names:
        v = lookup(row, name)
        if not _blank(v):
            return name, v
    return None, None


def message_text(value: Any) -> str | None:
    """A prompt as text: a string as it is; a chat list: its last user message."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        users = [m for m in value if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)]
        return users[-1]["content"] if users else None
    if isinstance(value, (int, float)):
        return str(value)
    return None


def question_of(row: dict) -> tuple[str | None, str | None]:
    for name in QUESTION:
        v = lookup(row, name)
        if _blank(v):
            continue
        text = message_text(v)
        if text is not None and text.strip():
            return name, text
    return None, None


def tests_value(raw: Any) -> Any:
    """A tests field as data: JSON strings decoded; APPS-style ``{"inputs", "outputs"[, "fn_name"]}``
    turned into a stdio or call spec (a call case's expected value is ``outputs[i]``, or its only
    element when it is a one-element list, as APPS graders accept)."""
    if isinstance(raw, str):
        raw = json.loads(raw)
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw and "kind" not in raw:
        ins, outs = raw["inputs"], raw["outputs"]
        if raw.get("fn_name"):
            cases = [{"args": list(i) if isinstance(i, list) else [i],
                      "expected": o[0] if isinstance(o, list) and len(o) == 1 else o} for i, o in zip(ins, outs)]
            return {"kind": "call", "fn_name": raw["fn_name"], "cases": cases}

        def text(x):
            return "\n".join(map(str, x)) if isinstance(x, list) else str(x)

        return {"kind": "stdio", "cases": [{"input": text(i), "output": text(o)} for i, o in zip(ins, outs)]}
    return raw
