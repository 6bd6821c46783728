"""Seeded arithmetic word problems at four difficulty levels.

1: addition or subtraction of numbers up to 20      "Tom has 7 apples and buys 5 more. ..."
2: addition or subtraction up to 100
3: multiplication or division with small factors
4: two steps (a product then a sum or difference)

The same (seed, levels, n) always gives the same tasks. Ids are content hashes, so a train and
an eval set drawn with different seeds can be checked for overlap (``disjoint``).
"""

from __future__ import annotations

import hashlib
import random

from masrl.data.draw import draw_distinct
from masrl.data.tasks import Task

NAMES = ["Tom", "Ana", "Ravi", "Mei", "Omar", "Lena", "Kofi", "Sara", "Ivan", "Yuki", "Nia", "Paul"]
ITEMS = ["apples", "pencils", "marbles", "books", "stickers", "coins", "cards", "shells", "cookies", "stamps"]


def _add_sub(rng: random.Random, hi: int) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(1, hi), rng.randint(1, hi)
    if rng.random() < 0.5:
        q = rng.choice([
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            f"{name} had {a} {item}. A friend gave {name} {b} more. How many {item} does {name} have?",
            f"There are {a} {item} in a box and {b} {item} on a table. How many {item} are there in all?",
        ])
        return q, a + b
    a, b = max(a, b), min(a, b)
    q = rng.choice([
        f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have left?",
        f"{name} had {a} {item} and lost {b} of them. How many {item} are left?",
    ])
    return q, a - b


def _mul_div(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have?", a * b
    return f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend get?", b


def _two_step(rng: random.Random) -> tuple[str, int]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    if rng.random() < 0.5:
        return (f"{name} buys {a} packs of {item} with {b} in each pack, and already had {c}. "
                f"How many {item} does {name} have now?"), a * b + c
    c = rng.randint(1, a * b)
    return (f"{name} has {a} boxes of {b} {item} and gives away {c}. "
            f"How many {item} does {name} have left?"), a * b - c


def make_problem(rng: random.Random, level: int) -> tuple[str, int]:
    if level == 1:
        return _add_sub(rng, 20)
    if level == 2:
        return _add_sub(rng, 100)
    if level == 3:
        return _mul_div(rng)
    if level == 4:
        return _two_step(rng)
    raise ValueError(f"difficulty level must be 1-4, got {level}")


def task_id(question: str) -> str:
    return "arith-" + hashlib.sha1(question.encode()).hexdigest()[:10]


def generate(n: int, *, seed: int = 0, levels: list[int] | tuple[int, ...] = (1,), exclude: set[str] | None = None) -> list[Task]:
    """``n`` distinct problems, levels drawn uniformly; questions in ``exclude`` are skipped."""
    rng = random.Random(seed)

    def attempt():
        level = rng.choice(list(levels))
        q, ans = make_problem(rng, level)
        return q, lambda k: Task(id=task_id(q), question=q, answer=str(ans), meta={"level": level})

    return draw_distinct(n, attempt, exclude=exclude or (), max_attempts=200 * n + 1000,
                         exhausted=f"could not draw {n} distinct problems at levels {list(levels)}; ask for fewer")
