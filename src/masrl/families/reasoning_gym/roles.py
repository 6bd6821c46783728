"""Prompts and parsers for reasoning-gym tasks (``source: reasoning_gym``): the solver, the checker, the finalizer.

Every prompt shows one worked example of each dataset in the run's mix, taken from the library itself
(``task.meta['examples']``: its question and its answer as the dataset writes it), so a 135M model sees the
answer format each scorer expects. With two bare example turns SmolLM2-135M-Instruct put its answer in the tags
on 81-100% of 20 datasets' questions; without examples it answers in prose (issue 56's outside try: 0.000-0.072).

The checker's examples are the same questions with an arithmetic expression where one answers them (the
library's own ``expression`` for its arithmetic datasets; the animals' legs from its own table for
``leg_counting``) and ``none`` where none does, so one prompt serves a mix of arithmetic and other datasets.
"""

from __future__ import annotations

from typing import Any

from masrl.parsing import TagSpec, nonempty, parse_tags

SOLVER_SYSTEM = ("You answer puzzles and math questions. Write only the final answer in <answer></answer>, "
                 "in the form the examples use.")
CALC_SOLVER_SYSTEM = ("You answer puzzles and math questions. Where arithmetic answers the question, write it in "
                      "<expr></expr> and a calculator computes it; then write the final answer in <answer></answer>, "
                      "in the form the examples use.")
CHECKER_SYSTEM = ("You turn a question into one arithmetic expression that a calculator computes. Write only the "
                  "expression in <expr></expr>; if no arithmetic answers the question, write <expr>none</expr>.")
FINALIZER_SYSTEM = ("You give the final answer to a question from a solver's answer and a calculator's result. "
                    "Write only the final answer in <answer></answer>.")

ANSWER_TAGS = [TagSpec("answer", nonempty)]
EXPR_TAGS = [TagSpec("expr", nonempty)]


def parse_answer(text: str):
    return parse_tags(text, ANSWER_TAGS)


def parse_expr(text: str):
    return parse_tags(text, EXPR_TAGS)


def parse_calc_solver(text: str):
    """``<expr>..</expr><answer>..</answer>``, or ``<answer>..</answer>`` alone where it wrote no expression (a
    question no arithmetic answers), so a solver that rightly writes none is not marked down for it."""
    return parse_tags(text, EXPR_TAGS + ANSWER_TAGS) if "<expr>" in text else parse_tags(text, ANSWER_TAGS)


def expression_of(example: dict) -> str | None:
    """An arithmetic expression that computes ``example``'s answer, from the library's own entry (None: none known)."""
    meta: dict[str, Any] = example.get("metadata") or {}
    if isinstance(meta.get("expression"), str):
        return meta["expression"]
    if example.get("dataset") == "leg_counting" and isinstance(meta.get("animals"), dict):
        from reasoning_gym.arithmetic.leg_counting import ANIMALS

        if all(a in ANIMALS for a in meta["animals"]):
            return " + ".join(f"{n} * {ANIMALS[a]}" for a, n in meta["animals"].items())
    return None


def examples_of(task) -> list[dict]:
    return list(task.meta.get("examples") or ())


def solver_examples(task) -> list[tuple[str, str]]:
    return [(e["question"], f"<answer>{e['answer']}</answer>") for e in examples_of(task)]


def calc_solver_examples(task) -> list[tuple[str, str]]:
    out = []
    for e in examples_of(task):
        expr = expression_of(e)
        out.append((e["question"], (f"<expr>{expr}</expr>" if expr else "") + f"<answer>{e['answer']}</answer>"))
    return out


def checker_examples(task) -> list[tuple[str, str]]:
    return [(e["question"], f"<expr>{expression_of(e) or 'none'}</expr>") for e in examples_of(task)]


def finalizer_prompt(question: str, solver: str | None, calculator: str) -> str:
    return f"Question: {question}\nSolver: {solver if solver else 'no answer'}\nCalculator: {calculator}"


def finalizer_examples(task) -> list[tuple[str, str]]:
    """Two turns: the calculator right where the solver was wrong (an arithmetic example), and the solver's answer
    kept where no arithmetic applies (another example), from the mix's own examples."""
    out = []
    arith = next((e for e in examples_of(task) if expression_of(e)), None)
    other = next((e for e in examples_of(task) if not expression_of(e)), None)
    if arith is not None:
        wrong = _off_by_one(arith["answer"])
        shown = f"{expression_of(arith)} = {arith['answer']}"
        out.append((finalizer_prompt(arith["question"], wrong, shown), f"<answer>{arith['answer']}</answer>"))
    if other is not None:
        out.append((finalizer_prompt(other["question"], other["answer"], "none"), f"<answer>{other['answer']}</answer>"))
    return out


def _off_by_one(answer: str) -> str:
    try:
        return str(int(answer) + 1)
    except ValueError:
        return answer + "0"
