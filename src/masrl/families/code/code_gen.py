"""Seeded function-writing tasks small enough that a 135M model sometimes solves them.

Each task asks for one named Python function and carries call tests: a few *visible* cases
(shown in test feedback) and more *hidden* ones (only scored), so a coder that copies the
feedback's expected values into its code does not pass. Level 1: one arithmetic or comparison
step; level 2: a loop over a list or a string.
"""

from __future__ import annotations

import random
import string
from typing import Callable

from masrl.data.draw import draw_distinct
from masrl.data.tasks import Task
from masrl.data.test_spec import TestSpec

Family = tuple[str, str, Callable[..., object], Callable[[random.Random], list]]  # fn, text, reference, args


def families(rng: random.Random, level: int) -> list[Family]:
    """The task families of ``level``, with their constants drawn from ``rng``. The constants
    (``k``, ``c``) vary the question text itself, so a seed's held-out questions leave thousands
    of others to train on (tasks that repeated a question with other tests left none)."""
    k = rng.randint(2, 60)
    c = rng.choice("abcdeilnorst")
    ints = lambda r: [r.randint(-20, 40)]  # noqa: E731
    pair = lambda r: [r.randint(-20, 40), r.randint(-20, 40)]  # noqa: E731
    nums = lambda r: [[r.randint(-9, 30) for _ in range(r.randint(1, 6))]]  # noqa: E731
    word = lambda r: ["".join(r.choice(string.ascii_lowercase[:8] + c * 2) for _ in range(r.randint(1, 8)))]  # noqa: E731
    if level == 1:
        return [
            (f"add_{k}", f"returns x plus {k}", lambda x: x + k, ints),
            (f"times_{k}", f"returns x multiplied by {k}", lambda x: x * k, ints),
            ("square", "returns x squared", lambda x: x * x, ints),
            ("bigger", "returns the larger of a and b", lambda a, b: max(a, b), pair),
            ("smaller", "returns the smaller of a and b", lambda a, b: min(a, b), pair),
            ("is_even", "returns True if x is even and False otherwise", lambda x: x % 2 == 0, ints),
            ("difference", "returns a minus b", lambda a, b: a - b, pair),
            (f"minus_{k}", f"returns x minus {k}", lambda x: x - k, ints),
            (f"above_{k}", f"returns True if x is greater than {k} and False otherwise", lambda x: x > k, ints),
            (f"divisible_by_{k}", f"returns True if x is divisible by {k} and False otherwise",
             lambda x: x % k == 0, lambda r: [r.choice([r.randint(-20, 40), k * r.randint(-3, 5)])]),
        ]
    return [
        ("total", "returns the sum of the numbers in the list xs", lambda xs: sum(xs), nums),
        ("largest", "returns the largest number in the list xs", lambda xs: max(xs), nums),
        ("first", "returns the first element of the list xs", lambda xs: xs[0], nums),
        ("last", "returns the last element of the list xs", lambda xs: xs[-1], nums),
        ("reverse", "returns the string s reversed", lambda s: s[::-1], word),
        (f"count_{c}", f"returns how many times the letter '{c}' appears in the string s",
         lambda s: s.count(c), word),
        ("length", "returns the number of elements in the list xs", lambda xs: len(xs), nums),
        ("count_positive", "returns how many numbers in the list xs are greater than 0",
         lambda xs: sum(1 for x in xs if x > 0), nums),
        (f"count_above_{k}", f"returns how many numbers in the list xs are greater than {k}",
         lambda xs: sum(1 for x in xs if x > k), nums),
        (f"total_plus_{k}", f"returns the sum of the numbers in the list xs plus {k}", lambda xs: sum(xs) + k, nums),
    ]


def params_of(args: list) -> str:
    """The parameter names the task text uses for these arguments."""
    if isinstance(args[0], list):
        return "xs"
    if isinstance(args[0], str):
        return "s"
    return "x" if len(args) == 1 else "a, b"


def call_tests(rng: random.Random, fn_name: str, ref: Callable[..., object], draw: Callable[[random.Random], list],
               visible: int, hidden: int) -> tuple[TestSpec, TestSpec]:
    """``visible + hidden`` call tests of ``fn_name`` on distinct drawn arguments (fewer when ``draw`` has
    fewer to give), their expected values from ``ref``; and the visible ones alone."""
    cases, keys = [], set()
    while len(cases) < visible + hidden and len(keys) < 200:
        args = draw(rng)
        key = repr(args)
        keys.add(key)
        if any(repr(c["args"]) == key for c in cases):
            continue
        cases.append({"args": args, "expected": ref(*args)})
    return TestSpec("call", tuple(cases), fn_name=fn_name), TestSpec("call", tuple(cases[:visible]), fn_name=fn_name)


def generate(n: int, *, seed: int = 0, levels: list[int] | tuple[int, ...] = (1,), visible: int = 2, hidden: int = 4,
             exclude: set[str] | None = None) -> list[Task]:
    """``n`` tasks; the same seed gives the same tasks. ``exclude``: questions to skip (held-out ones)."""
    rng = random.Random(seed)

    def attempt():
        level = rng.choice(list(levels))
        fn_name, text, ref, draw = rng.choice(families(rng, level))
        sample = draw(rng)
        question = f"Write a Python function `{fn_name}({params_of(sample)})` that {text}."

        def make(k: int) -> Task:
            spec, shown = call_tests(rng, fn_name, ref, draw, visible, hidden)
            return Task(f"code-{seed}-{k}", question, spec,
                        meta={"fn_name": fn_name, "visible_tests": shown, "level": level, "data_source": "code_gen"})

        return question, make

    return draw_distinct(n, attempt, exclude=exclude or (), max_attempts=n * 50)
