"""The expression language's bounds (``workflows.expr``) and the two errors it raises. All checked before the work
they bound (``Budget`` for one evaluation's):

- an expression's text is at most ``MAX_CHARS`` characters and its syntax tree at most ``MAX_DEPTH`` deep
  (checked before anything walks it), so no expression fails to load with a RecursionError;
- no value the evaluator builds is larger than ``MAX_SIZE``, counted deep (every character of every
  string in a list, so ``['a' * 1000000] * 100`` is 100 million, not 100): repetition, concatenation,
  list literals and every function's result (``join``, ``str``, ``numbered``, ...) are sized from their
  operands before they run; integers stay under ``MAX_BITS`` bits; ``%`` is arithmetic only;
- one evaluation walks at most ``MAX_WORK`` items in all (comparisons, ``in``, ``min``/``max``, the
  arguments of every function, each counted deep) and runs at most ``MAX_SECONDS``.
"""

from __future__ import annotations

import ast
import time
from typing import Any


class ExprError(ValueError):
    """An expression that does not parse or uses something the language lacks (raised at load)."""


class EvalError(ValueError):
    """An expression that failed on the values it met (a missing field, a bad operand)."""


MAX_SIZE = 1_000_000  # characters and items, counted deep, of a value one operation may build
MAX_BITS = 4096  # of an integer one operation may build
MAX_CHARS = 4000  # of an expression's text
MAX_DEPTH = 60  # of its syntax tree
MAX_WORK = 5 * MAX_SIZE  # items one evaluation may walk, in all (sizing them is part of the walk)
MAX_SECONDS = 2.0  # one evaluation's wall-clock time


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def size_of(value: Any, cap: int = MAX_SIZE) -> int:
    """``value``'s size counted deep: a string's characters, a list's or a dict's items plus theirs, an integer's
    64-bit words, 1 for anything else. The walk stops once past ``cap`` (the result is then ``cap + 1`` or more),
    so sizing costs at most ``cap`` steps, and it needs no recursion."""
    total, stack = 0, [value]
    while stack and total <= cap:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, (list, tuple)):
            total += len(v)
            if total <= cap:
                stack.extend(v)
        elif isinstance(v, dict):
            total += 2 * len(v)
            if total <= cap:
                stack.extend(v.keys())
                stack.extend(v.values())
        elif _is_int(v):
            total += 1 + v.bit_length() // 64
        else:
            total += 1
    return total


def size_check(op: type, left: Any, right: Any) -> str | None:
    """Why ``left op right`` would build too big a value (None: it would not). Called before the
    operation runs, so nothing oversized is ever allocated."""
    seqs = (str, list, tuple)
    if op is ast.Mult:
        seq, n = (left, right) if isinstance(left, seqs) else (right, left)
        if isinstance(seq, seqs) and _is_int(n) and n > 0 and size_of(seq) * n > MAX_SIZE:
            return f"repeating {len(seq):,} items {n:,} times builds more than {MAX_SIZE:,} (counted deep)"
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_BITS:
            return f"the product would have more than {MAX_BITS} bits"
    if op is ast.Add and isinstance(left, seqs) and isinstance(right, seqs) and size_of(left) + size_of(right) > MAX_SIZE:
        return f"joining {len(left):,} and {len(right):,} items builds more than {MAX_SIZE:,} (counted deep)"
    if op is ast.Mod and isinstance(left, (str, bytes)):
        return "'%' is arithmetic only here (string formatting is not part of the language)"
    return None


class Budget:
    """What one evaluation may still do: items to walk (``MAX_WORK``, counted deep) and time (``MAX_SECONDS``)."""

    def __init__(self):
        self.work, self.deadline = MAX_WORK, time.monotonic() + MAX_SECONDS

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise EvalError(f"the expression ran past {MAX_SECONDS:g} s")

    def walk(self, *values: Any) -> None:
        """Pay for walking ``values`` (each counted deep), before the walk."""
        for v in values:
            self.work -= size_of(v, max(self.work, 0))
        if self.work < 0:
            raise EvalError(f"the expression walks more than {MAX_WORK:,} items (counted deep) in one evaluation")
        self.tick()


def built(value: Any, what: str) -> Any:
    """``value``, unless it is larger than ``MAX_SIZE`` (counted deep)."""
    if size_of(value) > MAX_SIZE:
        raise EvalError(f"{what} builds more than {MAX_SIZE:,} characters and items (counted deep)")
    return value


# the most a function's result can be, from its arguments' deep size (the rest return no more than they take)
GROWTH = {"str": 6, "join": 1, "numbered": 2, "docs": 2}
