"""A small safe expression language for workflow graphs: conditions, arguments, template fields.

    answer.answer != "unknown" and len(decompose.queries) > 1
    task.meta.type == "two_hop" or runs.search_count < 3
    join(write.evidence, " | ")

Literals (strings, numbers, true/false/none, lists), names, field access (``a.b`` and ``a["b"]``,
on mappings only), indexing (``xs[0]``), comparisons (``== != < <= > >= in not in``), ``and``/
``or``/``not``, ``+ - * / %``, ``x if c else y`` and calls of the functions in ``FUNCTIONS``. Parsed
with Python's ``ast`` into a whitelist of node types and evaluated by the walker below: never
``eval``, no attribute access on objects, no names starting with ``_``, no keyword arguments.

Its bounds (the text's length, the tree's depth, the size of what an operation builds, an evaluation's work and
time) are in ``expr_bounds``, each checked before the work it bounds.

Everything that goes wrong at load is an ``ExprError`` and at run time an ``EvalError``, each naming the
expression (a graph adds the node).
"""

from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Any

from masrl.workflows.expr_bounds import (
    GROWTH,
    MAX_CHARS,
    MAX_DEPTH,
    MAX_SIZE,
    Budget,
    EvalError,
    ExprError,
    built,
    size_check,
    size_of,
)


def _join(xs, sep=" ") -> str:
    if not isinstance(sep, str):
        raise EvalError(f"join's separator must be a string, not a {type(sep).__name__}")
    items = list(xs or [])
    if len(sep) * len(items) > MAX_SIZE:
        raise EvalError(f"joining {len(items):,} items with a {len(sep):,}-character separator builds more than "
                        f"{MAX_SIZE:,}")
    return sep.join(str(x) for x in items)


def _take(xs, n) -> list:
    if not isinstance(n, (int, float)) or isinstance(n, bool) or n != n or n in (float("inf"), float("-inf")):
        raise EvalError(f"take's count must be a finite number, not {n!r}")
    return list(xs or [])[: int(n)]


def _docs(docs) -> str:
    from masrl.tools.search import show_docs

    items = list(docs or [])
    if not all(isinstance(d, dict) for d in items):
        raise EvalError("docs() takes a list of documents ({id, title?, text} objects), as search returns")
    return show_docs(items)


def _numbered(items) -> str:
    from masrl.workflows.prompting import numbered

    return numbered(["" if x is None else str(x) for x in items or []])


FUNCTIONS = {
    "len": len, "str": str, "int": int, "float": float, "min": min, "max": max, "abs": abs,
    "lower": lambda s: str(s).lower(), "strip": lambda s: str(s).strip(),
    "join": _join,
    "first": lambda xs, default=None: next(iter(xs or []), default),
    "take": _take,
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
            return _Evaluator(env).visit(self.tree)
        except EvalError as exc:
            raise EvalError(f"{exc} (in `{_short(self.source)}`)") from None
        except Exception as exc:  # whatever a function met (OverflowError, AttributeError, MemoryError, ...)
            raise EvalError(f"`{_short(self.source)}`: {type(exc).__name__}: {str(exc)[:300]}") from None


def _short(source: str) -> str:
    return source if len(source) <= 200 else source[:200] + "..."


def compile_expr(source: str) -> Expr:
    if not isinstance(source, str) or not source.strip():
        raise ExprError("an expression must be a non-empty string")
    if len(source) > MAX_CHARS:
        raise ExprError(f"`{_short(source)}` has {len(source):,} characters; an expression has at most {MAX_CHARS:,}")
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError as exc:
        raise ExprError(f"`{_short(source)}` does not parse: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # the parser's own limits
        raise ExprError(f"`{_short(source)}` does not parse: {type(exc).__name__} ({str(exc)[:100]}); it is nested "
                        f"too deeply") from None
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise ExprError(f"`{_short(source)}` nests {depth}+ levels deep; an expression has at most {MAX_DEPTH} (a sum "
                        f"of many terms nests one level a term: use join() or a shorter expression)")
    refs: list[tuple[str, str | None]] = []
    _check(tree, source, refs)
    return Expr(source.strip(), tree, tuple(refs))


def _depth(tree: ast.AST) -> int:
    """How deeply ``tree`` nests, counted without recursion, up to ``MAX_DEPTH + 1``."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            return d
        stack.extend((child, d + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _check(node: ast.AST, src: str, refs: list) -> None:
    """Refuse anything outside the language; record every ``name.field`` reference in ``refs``."""
    _Checker(src, refs).visit(node)


class _Checker(ast.NodeVisitor):
    """One method per kind of node the language allows; any other kind is an error."""

    def __init__(self, src: str, refs: list):
        self.src, self.refs = src, refs

    def generic_visit(self, node: ast.AST) -> None:
        raise ExprError(f"`{self.src}`: {type(node).__name__} is not part of the expression language "
                        f"(comparisons, and/or/not, + - * / %, field access, indexing, function calls)")

    def visit_all(self, nodes) -> None:
        for n in nodes:
            self.visit(n)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, (str, int, float, bool, type(None))):
            raise ExprError(f"`{self.src}`: literal {node.value!r} is not allowed")

    def visit_Name(self, node: ast.Name) -> None:
        if node.id.startswith("_"):
            raise ExprError(f"`{self.src}`: names starting with '_' are not allowed")
        if node.id not in CONSTANTS:
            self.refs.append((node.id, None))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = self._chain(node)
        if node.attr.startswith("_"):
            raise ExprError(f"`{self.src}`: fields starting with '_' are not allowed")
        if not chain:
            self.visit(node.value)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not self._chain(node):
            self.visit(node.value)
        self.visit(node.slice)

    def _chain(self, node) -> tuple | None:
        chain = _chain(node)
        if chain:  # name.field... : record the first field for load-time checks
            self.refs.append(chain)
        return chain

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        self.visit_all(node.values)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if not isinstance(node.op, (ast.Not, ast.USub)):
            self.generic_visit(node)
        self.visit(node.operand)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if type(node.op) not in _BIN:
            self.generic_visit(node)
        self.visit_all((node.left, node.right))
        literal = [_literal(n) for n in (node.left, node.right)]
        if all(v is not _UNKNOWN for v in literal):  # both sides known now: refuse here, not at run time
            why = size_check(type(node.op), *literal)
            if why:
                raise ExprError(f"`{self.src}`: {why}")

    def visit_Compare(self, node: ast.Compare) -> None:
        if not all(type(op) in _CMP for op in node.ops):
            self.generic_visit(node)
        self.visit_all([node.left, *node.comparators])

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.visit_all((node.test, node.body, node.orelse))

    def visit_List(self, node: ast.List) -> None:
        self.visit_all(node.elts)

    visit_Tuple = visit_List

    def visit_Call(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise ExprError(f"`{self.src}`: unknown function '{name}' (functions: {', '.join(sorted(FUNCTIONS))})")
        if node.keywords:
            raise ExprError(f"`{self.src}`: keyword arguments are not allowed")
        self.visit_all(node.args)


_UNKNOWN = object()


def _literal(node: ast.AST) -> Any:
    """A literal's value (a constant, or a list of constants), else ``_UNKNOWN``."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple)) and all(isinstance(e, ast.Constant) for e in node.elts):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return _UNKNOWN


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
    return _Evaluator(env).visit(node)


class _Evaluator(ast.NodeVisitor):
    """Evaluates a checked expression; one method per kind of node, all inside one ``_Budget``."""

    def __init__(self, env: dict[str, Any]):
        self.env = env
        self.budget = Budget()

    def visit(self, node: ast.AST) -> Any:
        self.budget.tick()
        return super().visit(node)

    def generic_visit(self, node: ast.AST) -> Any:
        raise EvalError(f"cannot evaluate {type(node).__name__}")

    def visit_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def visit_Name(self, node: ast.Name) -> Any:
        if node.id in CONSTANTS:
            return CONSTANTS[node.id]
        if node.id not in self.env:
            raise EvalError(f"'{node.id}' has no value yet")
        return self.env[node.id]

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        return _field(self.visit(node.value), node.attr, ast.unparse(node.value))

    def visit_Subscript(self, node: ast.Subscript) -> Any:
        return _field(self.visit(node.value), self.visit(node.slice), ast.unparse(node.value))

    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        """Python's short circuit: ``and`` returns the first falsy value, ``or`` the first truthy one."""
        stop_when = not isinstance(node.op, ast.And)
        out: Any = not stop_when
        for v in node.values:
            out = self.visit(v)
            if bool(out) == stop_when:
                return out
        return out

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.visit(node.operand)
        return (not v) if isinstance(node.op, ast.Not) else -v

    def visit_BinOp(self, node: ast.BinOp) -> Any:
        left, right = self.visit(node.left), self.visit(node.right)
        why = size_check(type(node.op), left, right)
        if why:
            raise EvalError(why)
        self.budget.walk(left, right)
        return _BIN[type(node.op)](left, right)

    def visit_Compare(self, node: ast.Compare) -> bool:
        left = self.visit(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = self.visit(comp)
            self.budget.walk(left, right)  # ==, < and in walk both sides
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def visit_List(self, node: ast.List) -> list:
        return built([self.visit(v) for v in node.elts], "a list literal")

    visit_Tuple = visit_List

    def visit_Call(self, node: ast.Call) -> Any:
        name = node.func.id  # type: ignore[attr-defined]
        args = [self.visit(a) for a in node.args]
        self.budget.walk(*args)  # every function here walks what it is given at most once
        grows = GROWTH.get(name)
        if grows and sum(size_of(a) for a in args) * grows > MAX_SIZE * 4:
            raise EvalError(f"{name}() of {sum(size_of(a) for a in args):,} characters and items (counted deep) "
                            f"would build more than {MAX_SIZE:,}")
        return built(FUNCTIONS[name](*args), f"{name}()")


@dataclass(frozen=True)
class Template:
    """Text with ``{expression}`` fields; ``{{`` and ``}}`` are literal braces."""

    source: str
    parts: tuple  # str | Expr

    def render(self, env: dict[str, Any]) -> str:
        """The text with every field filled; the whole of it, all fields together, is held to ``MAX_SIZE``
        characters (each field's value alone is already bounded by its expression's budget)."""
        out, total = [], 0
        for p in self.parts:
            if isinstance(p, str):
                piece = p
            else:
                v = p(env)
                piece = _numbered(v) if isinstance(v, list) else "" if v is None else str(v)
            total += len(piece)
            if total > MAX_SIZE:
                raise EvalError(f"the rendered text holds more than {MAX_SIZE:,} characters (all its fields together)")
            out.append(piece)
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
