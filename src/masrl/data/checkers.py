"""Output checkers for stdin/stdout tests: pure functions ``(got, expected) -> bool``."""

from __future__ import annotations

import math


def exact(got: str, expected: str) -> bool:
    return got == expected


def lines(got: str, expected: str) -> bool:
    """Equal after stripping trailing spaces on each line and trailing blank lines."""

    def norm(s: str) -> list[str]:
        out = [ln.rstrip() for ln in s.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return norm(got) == norm(expected)


def _float_eq(a: str, b: str, tol: float) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= tol * max(1.0, abs(y))


def floats(got: str, expected: str, tol: float = 1e-6) -> bool:
    """Token by token; numbers equal within a relative/absolute tolerance."""
    g, e = got.split(), expected.split()
    return len(g) == len(e) and all(_float_eq(a, b, tol) for a, b in zip(g, e))


def tokens_ci(got: str, expected: str) -> bool:
    return [t.lower() for t in got.split()] == [t.lower() for t in expected.split()]


def tokens_unordered(got: str, expected: str) -> bool:
    return sorted(got.split()) == sorted(expected.split())


CHECKERS = {"exact": exact, "lines": lines, "whitespace": lines, "float": floats, "tokens_ci": tokens_ci,
            "tokens_unordered": tokens_unordered}
