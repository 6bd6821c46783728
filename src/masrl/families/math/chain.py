"""Word problems that chain several events on one count (``source: math_chain``).

A task states a start and ``level`` events, each changing the count by one operation, then asks for the end:

    Ana has 14 apples. Then Ana buys 3 packs with 5 in each pack. Then Ana gives away 9. Then Ana splits
    them into 4 equal piles and keeps one pile. How many apples does Ana have now?      (answer 5)

Events: finds or buys more (``add``), gives away or loses some (``sub``), buys packs (``packs``: + a x b),
splits into equal piles and keeps one (``split``: exact division), doubles or triples (``times``). One
expression for the whole chain needs brackets ((14 + 3 * 5 - 9) / 4); one event at a time is a one- or
two-step problem of ``arithmetic``'s kind. ``meta`` keeps what the workflows score steps by: ``start``,
``events`` (each ``{"text", "op", "args"}``, the sentence without its "Then") and ``values`` (the count
after each event). Levels 2-8: the number of events. The same (seed, levels, n) gives the same tasks.
"""

from __future__ import annotations

import hashlib
import random

from masrl.data.draw import draw_distinct
from masrl.data.tasks import Task
from masrl.families.math.arithmetic import ITEMS, NAMES

LEVELS = tuple(range(2, 9))  # 2-8 events; the shipped configs train on 3-4 and longer chains test length
MAX_COUNT = 200  # no count past this: small numbers, as in arithmetic's problems


def apply(op: str, args: list[int], count: float) -> float:
    """The count after an event ``op`` with ``args`` happens to ``count``."""
    if op == "add":
        return count + args[0]
    if op == "sub":
        return count - args[0]
    if op == "packs":
        return count + args[0] * args[1]
    if op == "split":  # exact: a count the piles do not divide (a wrong earlier step) gives a fraction
        return count // args[0] if count % args[0] == 0 else count / args[0]
    if op == "times":
        return count * args[0]
    raise ValueError(f"unknown event {op!r}")


def _event(rng: random.Random, name: str, item: str, count: int) -> tuple[str, str, list[int]] | None:
    """One event that keeps the count a whole number from 1 to ``MAX_COUNT`` (None: this draw does not)."""
    op = rng.choice(["add", "sub", "packs", "split", "times"])
    if op == "add":
        b = rng.randint(2, 20)
        text = rng.choice([f"{name} buys {b} more.", f"{name} finds {b} more.", f"A friend gives {name} {b} more."])
        args = [b]
    elif op == "sub":
        if count < 3:
            return None
        b = rng.randint(1, min(count - 1, 20))
        text = rng.choice([f"{name} gives away {b}.", f"{name} loses {b} of them."])
        args = [b]
    elif op == "packs":
        a, b = rng.randint(2, 6), rng.randint(2, 6)
        text, args = f"{name} buys {a} packs with {b} in each pack.", [a, b]
    elif op == "split":
        ways = [d for d in (2, 3, 4, 5) if count % d == 0 and count // d >= 2]
        if not ways:
            return None
        d = rng.choice(ways)
        text, args = f"{name} splits them into {d} equal piles and keeps one pile.", [d]
    else:
        k = rng.choice([2, 3])
        text, args = f"The number of {item} {'doubles' if k == 2 else 'triples'}.", [k]
    return (text, op, args) if 1 <= apply(op, args, count) <= MAX_COUNT else None


def make_problem(rng: random.Random, level: int) -> tuple[str, int, dict]:
    """One problem of ``level`` events: (question, answer, meta)."""
    if level not in LEVELS:
        raise ValueError(f"math_chain levels are the number of events, {LEVELS[0]}-{LEVELS[-1]}; got {level}")
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start = count = rng.randint(4, 30)
    events, values = [], []
    while len(events) < level:
        ev = _event(rng, name, item, count)
        if ev is None:
            continue
        text, op, args = ev
        count = apply(op, args, count)
        events.append({"text": text, "op": op, "args": args})
        values.append(count)
    q = " ".join([f"{name} has {start} {item}.", *(then(e["text"]) for e in events),
                  f"How many {item} does {name} have now?"])
    return q, count, {"level": level, "start": start, "name": name, "item": item, "events": events, "values": values}


def then(text: str) -> str:
    """An event's sentence as the chain tells it: "Then Ana buys 3 more.", "Then the number of cards doubles."."""
    lead = text.split(" ", 1)[0]
    return f"Then {lead.lower() if lead in ('The', 'A') else lead} {text.split(' ', 1)[1]}"


def step_question(meta: dict, k: int, count: object) -> str:
    """Event ``k`` alone as a problem from ``count``: "Ana has 29 apples. Ana gives away 9. How many ...?"."""
    name, item = meta["name"], meta["item"]
    return f"{name} has {count} {item}. {meta['events'][k]['text']} How many {item} does {name} have now?"


def task_id(question: str) -> str:
    return "chain-" + hashlib.sha1(question.encode()).hexdigest()[:10]


def generate(n: int, *, seed: int = 0, levels: list[int] | tuple[int, ...] = (3,),
             exclude: set[str] | None = None) -> list[Task]:
    """``n`` distinct problems, levels drawn uniformly; questions in ``exclude`` are skipped."""
    rng = random.Random(f"math_chain-{seed}")

    def attempt():
        q, ans, meta = make_problem(rng, rng.choice(list(levels)))
        return q, lambda k: Task(id=task_id(q), question=q, answer=str(ans), meta=meta)

    return draw_distinct(n, attempt, exclude=exclude or (), max_attempts=100 * n + 1000,
                         exhausted=f"could not draw {n} distinct problems at levels {list(levels)}; ask for fewer")
