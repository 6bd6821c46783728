"""Turn a pydantic ValidationError on a config into lines that name the key and the fix."""

from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError


def _suggest(loc: tuple, root: type[BaseModel]) -> str:
    """For an unknown key, suggest the closest allowed key."""
    node: Any = root
    for part in loc[:-1]:
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return ""
            node = field.annotation
        else:  # a dict, list or optional around a model: this part is a key or an index
            args = [a for a in typing.get_args(node) if a is not type(None)]
            node = _model_in(args[-1]) if args else None
            if node is None:
                return ""
        if not (isinstance(node, type) and issubclass(node, BaseModel)) and typing.get_origin(node) not in (dict, list):
            node = _model_in(node)
    model = node if isinstance(node, type) and issubclass(node, BaseModel) else None
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean `{close[0]}`?)" if close else f" (allowed: {', '.join(model.model_fields)})"


def _model_in(ann: Any):
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def format_validation_error(exc: ValidationError, source: str, root: type[BaseModel]) -> str:
    """One line per error; ``root``: the model validated (for "did you mean" suggestions)."""
    return "\n".join([f"invalid config {source}:", *error_lines(exc, root)])


def error_lines(exc: ValidationError, root: type[BaseModel], prefix: str = "") -> list[str]:
    """Each error of ``exc`` on a line naming its key (after ``prefix``, the dotted place ``root`` sits at in
    the config) and the fix: a close match for an unknown key at any depth."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in (prefix.split(".") if prefix else []) + list(loc))
        if err["type"] == "extra_forbidden":
            lines.append(f"  unknown key `{key}`{_suggest(loc, root)}; remove or rename it")
        elif err["type"] == "missing":
            lines.append(f"  missing key `{key}`: add it")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            got_s = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
            lines.append(f"  `{key}`: {msg}{got_s}" if key else f"  {msg}")
    return lines
