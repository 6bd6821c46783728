"""Strict tag-format parsing with partial credit.

An agent's output format is an ordered list of tags, e.g. ``<solution>..</solution><answer>..</answer>``.
``parse_tags`` extracts the fields leniently (so a workflow can go on with a near-miss) and scores
the format strictly: ``ok`` only when every check passes, ``score`` the fraction of checks passed.
Partial credit matters for GRPO: a small model rarely gets everything right at first, and a
group whose samples all score 0 has no reward variance to learn from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

Validator = Callable[[str], bool]


@dataclass(frozen=True)
class TagSpec:
    name: str
    validate: Validator | None = None  # content check, e.g. "is a number"


@dataclass
class ParseResult:
    ok: bool
    score: float
    fields: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


_NUMBER = re.compile(r"^\s*[-+]?\$?\s*(\d{1,3}(,\d{3})+|\d+)(\.\d+)?\s*$")


def is_number(text: str) -> bool:
    return bool(_NUMBER.match(text))


def one_of(*choices: str) -> Validator:
    allowed = {c.lower() for c in choices}
    return lambda text: text.strip().lower() in allowed


def nonempty(text: str) -> bool:
    return bool(text.strip())


def parse_tags(text: str, specs: list[TagSpec], *, strict_outside: bool = True) -> ParseResult:
    """Score ``text`` against the ordered tag ``specs``.

    Checks, each worth the same: per tag, it opens and closes exactly once; its content passes
    the validator (or is non-empty); then the tags come in order; then (``strict_outside``) no
    text other than whitespace sits outside the tags.
    """
    fields: dict[str, str] = {}
    errors: list[str] = []
    passed = 0
    total = 0
    spans: list[tuple[int, int]] = []
    for spec in specs:
        total += 2
        passed += _check_tag(text, spec, fields, errors, spans)
    if len(specs) > 1:
        total += 1
        if len(spans) == len(specs) and all(a[1] <= b[0] for a, b in zip(spans, spans[1:])):
            passed += 1
        else:
            errors.append("tags are missing or out of order: expected " + " ".join(f"<{s.name}>" for s in specs))
    if strict_outside:
        total += 1
        outside = text
        for a, b in sorted(spans, reverse=True):
            outside = outside[:a] + outside[b:]
        if len(spans) == len(specs) and not outside.strip():
            passed += 1
        else:
            errors.append("text outside the tags")
    score = passed / total if total else 1.0
    return ParseResult(ok=passed == total, score=score, fields=fields, errors=errors)


def _check_tag(text: str, spec: TagSpec, fields: dict, errors: list, spans: list) -> int:
    """The two checks of one tag (opens and closes once; valid content): how many passed. Its
    content goes in ``fields``, its span (when well formed) in ``spans``."""
    open_t, close_t = f"<{spec.name}>", f"</{spec.name}>"
    start = text.find(open_t)
    if start < 0:
        errors.append(f"missing {open_t}")
        return 0
    passed = 0
    body_start = start + len(open_t)
    end = text.find(close_t, body_start)
    content = text[body_start:] if end < 0 else text[body_start:end]
    if end < 0:  # lenient: an unclosed last tag still yields its content up to the next tag
        nxt = content.find("<")
        content = content if nxt < 0 else content[:nxt]
    fields[spec.name] = content.strip()
    if text.count(open_t) == 1 and text.count(close_t) == 1 and end >= 0:
        passed += 1
        spans.append((start, end + len(close_t)))
    else:
        errors.append(f"{open_t} must open and close exactly once")
    if (spec.validate or nonempty)(content):
        passed += 1
    else:
        errors.append(f"content of {open_t} is not valid: {content.strip()[:40]!r}")
    return passed


def parse_json_key(text: str, key: str, *, want: type | None = list) -> ParseResult:
    """A JSON object holding ``key`` (``{"queries": ["a", "b"]}``); field ``key`` gets its value.

    Checks, each worth the same: the text is one JSON object (a leading/trailing fence or spaces
    allowed; an object cut off by a stop string is closed for it); it has ``key``; the value has
    type ``want`` (a list must hold non-empty strings). Field ``text`` keeps the raw completion; field ``key``
    is set only to a value of type ``want`` (a list: its non-empty strings), so a workflow never meets
    ``{"queries": 5}``'s 5 where it expects a list.
    """
    import json

    body = text.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
    obj, errors = None, []
    start = body.find("{")
    if start >= 0:
        for tail in ("", "}", "]}", "\"]}"):
            try:
                obj = json.loads(body[start:] + tail)
                break
            except json.JSONDecodeError:
                continue
    checks = [isinstance(obj, dict) and start == 0]
    if obj is None:
        errors.append("not a JSON object")
    fields: dict = {"text": text}
    value = obj.get(key) if isinstance(obj, dict) else None
    checks.append(value is not None)
    if value is None:
        errors.append(f"no key '{key}'")
    typed = value is not None and (want is None or isinstance(value, want))
    if typed and want is list:
        value = [str(v).strip() for v in value if isinstance(v, (str, int, float)) and str(v).strip()]
        typed = bool(value) and len(value) == len(obj[key])
    checks.append(typed)
    if value is not None and (want is None or isinstance(value, want)):  # a wrong type never reaches the workflow
        fields[key] = value
    if value is not None and not typed:
        errors.append(f"'{key}' must be a {'list of non-empty strings' if want is list else want.__name__}")
    return ParseResult(all(checks), sum(checks) / len(checks), fields, errors)
