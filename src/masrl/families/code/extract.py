"""Pull the program out of a model's reply: a <code> tag, else the last fenced block that parses."""

from __future__ import annotations

import ast
import re

_TAG = re.compile(r"<code>(.*?)(?:</code>|$)", re.S)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|$)", re.S)


def _parses(src: str) -> bool:
    try:
        ast.parse(src)
        return True
    except (SyntaxError, ValueError):
        return False


def extract_code(text: str) -> str | None:
    """The code in ``text``, or None when there is none.

    Order: the last ``<code>...</code>`` block; else the last fenced block (python or untagged)
    that parses, else the last fenced block at all; else the whole text if it parses as Python.
    """
    tags = [m.strip("\n") for m in _TAG.findall(text)]
    if tags:
        return tags[-1]
    blocks = [(lang.lower(), body.strip("\n")) for lang, body in _FENCE.findall(text)]
    pyish = [b for lang, b in blocks if lang in ("", "python", "py", "python3")]
    for body in reversed(pyish):
        if _parses(body):
            return body
    if blocks:
        return blocks[-1][1]
    stripped = text.strip()
    if stripped and _parses(stripped) and ("\n" in stripped or stripped.startswith(("def ", "import ", "print"))):
        return stripped
    return None
