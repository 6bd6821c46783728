"""A small safe expression language for workflow graphs: conditions, arguments, template fields.

    answer.answer != "unknown" and len(decompose.queries) > 1
    task.meta.type == "two_hop" or runs.search_count < 3
    join(write.evidence, " | ")

Literals (strings, numbers, true/false/none, lists), names, field access (``a.b`` and ``a["b"]``,
on mappings only), indexing (``xs[0]``), comparisons (``== != < <= > >= in not in``), ``and``/
``or``/``not``, ``+ - * / %``, ``x if c else y`` and calls of the functions in ``FUNCTIONS``. Parsed
with Python's ``ast`` into a whitelist of node types and evaluated by the walker below: never
``eval``, no attribute access on objects, no names starting with ``_``, no keyword arguments.
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any


class ExprError(ValueError):
    """An expression that does not parse or uses something the language lacks (raised at load)."""


class EvalError(ValueError):
    """An expression that failed on the values it met (a missing field, a bad operand)."""


def _docs(docs) -> str:
    from masrl.tools.search import show_docs

    return show_docs(list(docs or []))


def _numbered(items) -> str:
    from masrl.workflows.search_team import numbered

    return numbered(["" if x is None else str(x) for x in items or []])


FUNCTIONS = {
    "len": len, "str": str, "int": int, "float": float, "min": min, "max": max, "abs": abs,
    "lower": lambda s: str(s).lower(), "strip": lambda s: str(s).strip(),
    "join": lambda xs, sep=" ": sep.join(str(x) for x in xs or []),
    "first": lambda xs, default=None: next(iter(xs or []), default),
    "take": lambda xs, n: list(xs or [])[: int(n)],
    "get": lambda m, k, default=None: m.get(k, default) if isinstance(m, dict) else default,
    "docs": _docs, "numbered": _numbered,
}
CONSTANTS = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.Mod: operator.mod}
_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


@dataclass(frozen=True)
class Expr:
    source: str
    tree: ast.AST
    refs: tuple[tuple[str, str | None], ...]  # (name, first field) of every name the expression reads

    def __call__(self, env: dict[str, Any]) -> Any:
        try:
            return _eval(self.tree, env)
        except EvalError as exc:
            raise EvalError(f"{exc} (in `{self.source}`)") from None
        except (TypeError, ZeroDivisionError, ValueError, IndexError) as exc:
            raise EvalError(f"`{self.source}`: {type(exc).__name__}: {exc}") from None


def compile_expr(source: str) -> Expr:
    if not isinstance(source, str) or not source.strip():
        raise ExprError("an expression must be a non-empty string")
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"`{source}` does not parse: {exc.msg}") from None
    refs: list[tuple[str, str | None]] = []
    _check(tree, source, refs)
    return Expr(source.strip(), tree, tuple(refs))


def _check(node: ast.AST, src: str, refs: list) -> None:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, (str, int, float, bool, type(None))):
            raise ExprError(f"`{src}`: literal {node.value!r} is not allowed")
        return
    if isinstance(node, ast.Name):
        if node.id.startswith("_"):
            raise ExprError(f"`{src}`: names starting with '_' are not allowed")
        if node.id not in CONSTANTS:
            refs.append((node.id, None))
        return
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        chain = _chain(node)
        if chain:  # name.field... : record the first field for load-time checks
            refs.append(chain)
        if isinstance(node, ast.Attribute):
            if node.attr.startswith("_"):
                raise ExprError(f"`{src}`: fields starting with '_' are not allowed")
            if not chain:
                _check(node.value, src, refs)
        else:
            if not chain:
                _check(node.value, src, refs)
            _check(node.slice, src, refs)
        return
    if isinstance(node, ast.BoolOp):
        for v in node.values:
            _check(v, src, refs)
        return
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        _check(node.operand, src, refs)
        return
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        _check(node.left, src, refs)
        _check(node.right, src, refs)
        return
    if isinstance(node, ast.Compare) and all(type(op) in _CMP for op in node.ops):
        for v in [node.left, *node.comparators]:
            _check(v, src, refs)
        return
    if isinstance(node, ast.IfExp):
        for v in (node.test, node.body, node.orelse):
            _check(v, src, refs)
        return
    if isinstance(node, (ast.List, ast.Tuple)):
        for v in node.elts:
            _check(v, src, refs)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(f"`{src}`: unknown function '{name}' (functions: {', '.join(sorted(FUNCTIONS))})")
        if node.keywords:
            raise ExprError(f"`{src}`: keyword arguments are not allowed")
        for a in node.args:
            _check(a, src, refs)
        return
    raise ExprError(f"`{src}`: {type(node).__name__} is not part of the expression language "
                    f"(comparisons, and/or/not, + - * / %, field access, indexing, function calls)")


def _chain(node: ast.AST) -> tuple[str, str | None] | None:
    """``(name, first field)`` when ``node`` is ``name.field...`` / ``name["field"]...``."""
    parts = []
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        elif isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            parts.append(node.slice.value)
        else:
            parts.append(None)
        node = node.value
    if isinstance(node, ast.Name) and node.id not in CONSTANTS:
        return node.id, parts[-1] if parts else None
    return None


def _field(value: Any, key: Any, where: str) -> Any:
    if isinstance(value, dict):
        if key not in value:
            raise EvalError(f"{where} has no field '{key}' (fields: {', '.join(map(str, value)) or 'none'})")
        return value[key]
    if isinstance(value, (list, tuple, str)) and isinstance(key, int) and not isinstance(key, bool):
        try:
            return value[key]
        except IndexError:
            raise EvalError(f"{where}[{key}] is out of range (length {len(value)})") from None
    raise EvalError(f"cannot take '{key}' of {where} (a {type(value).__name__})")


def _eval(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id not in env:
            raise EvalError(f"'{node.id}' has no value yet")
        return env[node.id]
    if isinstance(node, ast.Attribute):
        return _field(_eval(node.value, env), node.attr, ast.unparse(node.value))
    if isinstance(node, ast.Subscript):
        return _field(_eval(node.value, env), _eval(node.slice, env), ast.unparse(node.value))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            out: Any = True
            for v in node.values:
                out = _eval(v, env)
                if not out:
                    return out
            return out
        out = False
        for v in node.values:
            out = _eval(v, env)
            if out:
                return out
        return out
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env)
        return (not v) if isinstance(node.op, ast.Not) else -v
    if isinstance(node, ast.BinOp):
        return _BIN[type(node.op)](_eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(v, env) for v in node.elts]
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*[_eval(a, env) for a in node.args])  # type: ignore[attr-defined]
    raise EvalError(f"cannot evaluate {type(node).__name__}")


@dataclass(frozen=True)
class Template:
    """Text with ``{expression}`` fields; ``{{`` and ``}}`` are literal braces."""

    source: str
    parts: tuple  # str | Expr

    def render(self, env: dict[str, Any]) -> str:
        out = []
        for p in self.parts:
            if isinstance(p, str):
                out.append(p)
            else:
                v = p(env)
                out.append(_numbered(v) if isinstance(v, list) else "" if v is None else str(v))
        return "".join(out)

    @property
    def exprs(self) -> list[Expr]:
        return [p for p in self.parts if isinstance(p, Expr)]


def compile_template(source: str) -> Template:
    parts: list = []
    buf, i = [], 0
    while i < len(source):
        ch = source[i]
        if source.startswith("{{", i) or source.startswith("}}", i):
            buf.append(ch)
            i += 2
        elif ch == "{":
            end = source.find("}", i)
            if end < 0:
                raise ExprError(f"template field opened at character {i} is never closed: {source[i:i + 30]!r}")
            if buf:
                parts.append("".join(buf))
                buf = []
            parts.append(compile_expr(source[i + 1:end]))
            i = end + 1
        elif ch == "}":
            raise ExprError(f"a lone '}}' at character {i} of the template (write '}}}}' for a literal brace)")
        else:
            buf.append(ch)
            i += 1
    if buf:
        parts.append("".join(buf))
    return Template(source, tuple(parts))
