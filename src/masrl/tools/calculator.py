"""A calculator: exact arithmetic on an expression a model wrote ("47 + 38", "(5 * 6) + 3").

Numbers, ``+ - * / // %``, unary minus and parentheses, parsed with Python's ``ast`` into a
whitelist of node types and evaluated by the walker below: never ``eval``, nothing else runs, so
it needs no sandbox. Powers are left out (``9 ** 9 ** 9`` would hang the caller), and operands past
``LIMIT`` are refused. Anything else is the model's mistake: ``ToolUseError`` with the reason.
"""

from __future__ import annotations

import ast
import operator

from masrl.tools.base import Tool, ToolUseError

LIMIT = 1e15
MAX_CHARS = 200
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_TIDY = str.maketrans({"×": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "–": "-", ",": ""})


def _walk(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _walk(node.left), _walk(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolUseError("division by zero")
        value = _BIN[type(node.op)](left, right)
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_walk(node.operand))
    else:
        raise ToolUseError(f"only numbers, + - * / // %, and parentheses are allowed, not '{ast.unparse(node)}'")
    if abs(value) > LIMIT:
        raise ToolUseError(f"a value past {LIMIT:g} is out of range")
    return value


def calculate(expression: str) -> float:
    """The value of an arithmetic expression; ``ToolUseError`` says why one cannot be computed.
    Written multiplication signs (x, ×), thousands commas and a trailing "= ..." are accepted."""
    text = str(expression).split("=")[0].translate(_TIDY).strip()
    if not text:
        raise ToolUseError("empty expression")
    if len(text) > MAX_CHARS:
        raise ToolUseError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolUseError(f"not an arithmetic expression: '{text}'") from None
    return _walk(tree.body)


def show(value: float) -> str:
    """A computed value as a model reads it: whole numbers without ".0", others to 6 places."""
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def calculator_tool() -> Tool:
    def calculator(expression: str) -> str:
        """Compute an arithmetic expression exactly (numbers, + - * / // %, parentheses)."""
        return show(calculate(expression))

    return Tool.from_function(calculator, timeout_s=5.0)
