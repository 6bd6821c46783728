"""Answer extraction and equivalence.

Gold answers may be plain ("42"), GSM8K style ("... #### 42") or LaTeX (``\\boxed{42}``).
Equivalence goes through math-verify when it can parse both sides, with a numeric fallback
("1,000" == "1000.0", "$5" == "5").
"""

from __future__ import annotations

import re

_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_NUM = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?|[-+]?\.\d+")


def extract_gold(text: str) -> str:
    """The final answer inside a reference solution."""
    text = str(text)
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    boxed = _BOXED.findall(text)
    if boxed:
        return boxed[-1].strip()
    return text.strip()


def to_number(text: str) -> float | None:
    """The last number in ``text`` ("$1,200.50" -> 1200.5), or None."""
    if text is None:
        return None
    found = _NUM.findall(str(text).replace("$", ""))
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _numeric_equal(a: str, b: str) -> bool | None:
    x, y = to_number(a), to_number(b)
    if x is None or y is None:
        return None
    return abs(x - y) <= 1e-6 * max(1.0, abs(y))


def answer_score(pred, gold) -> float:
    """1.0 when ``pred`` states the gold answer (``answers_equivalent``), else 0.0 (also for None)."""
    return float(answers_equivalent(pred, gold))


def answers_equivalent(pred, gold) -> bool:
    """True when ``pred`` states the same answer as ``gold`` (or, for a list of golds, as any of them)."""
    if pred is None:
        return False
    if isinstance(gold, (list, tuple)):
        return any(answers_equivalent(pred, g) for g in gold)
    pred_s, gold_s = str(pred).strip(), extract_gold(str(gold))
    if not pred_s:
        return False
    if pred_s == gold_s:
        return True
    numeric = _numeric_equal(pred_s, gold_s)
    if numeric is not None and re.fullmatch(r"[-+$\d.,\s]+", pred_s) and re.fullmatch(r"[-+$\d.,\s]+", gold_s):
        return numeric
    try:
        from math_verify import parse, verify

        g = parse(gold_s if "$" in gold_s or "\\" in gold_s else f"${gold_s}$")
        p = parse(pred_s if "$" in pred_s or "\\" in pred_s else f"${pred_s}$")
        if g and p:
            return bool(verify(g, p))
    except Exception:  # math-verify raises on exotic input; fall back to numbers
        pass
    return bool(numeric)
