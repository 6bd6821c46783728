"""What a run's tasks hold, said before it trains: each split's size and mix of kinds, how often a
training task comes back, and a warning where a split is shorter than the ``n`` it asked for or the
training tasks are mixed unlike the held-out ones (by more than drawing the held-out set from the training mix
would give: twenty kinds and 120 held-out tasks differ by 16% from sampling alone).

Both happen quietly otherwise. A generator over a finite world runs out: ``qa_world`` over 300
documents holds 480 one-hop questions, so ``data.train.n: 2000`` gives 360 once the 120 held-out ones
are removed, and a run of 60 steps x 72 tasks sees each about 12 times. And a held-out set drawn with
every kind of question in equal shares, from kinds whose pools differ in size, leaves the rarer kinds'
leftovers to training: there, 23% of the held-out questions ask for a headquarters against 9% of the
training ones. A held-out figure then averages over another mix than the one that trained.
"""

from __future__ import annotations

import math
from collections import Counter

from masrl.data.tasks import Task

SHIFT_WARN = 0.10  # total variation distance between the two mixes above which the run says so...
NOISE_TIMES = 2.0  # ...when it is also this many times what drawing the held-out set alone would give


def kind_of(task: Task) -> str | None:
    """A task's kind: ``meta['kind']`` (a generator's question template), else its type, else its level."""
    for key in ("kind", "type", "level"):
        if task.meta.get(key) is not None:
            return str(task.meta[key])
    return None


def mix(tasks: list[Task]) -> dict[str, float]:
    """Each kind's share of ``tasks`` (tasks without a kind are left out); most common first."""
    kinds = Counter(k for k in map(kind_of, tasks) if k is not None)
    total = sum(kinds.values())
    return {k: c / total for k, c in kinds.most_common()} if total else {}


def shift(a: dict[str, float], b: dict[str, float]) -> float:
    """Total variation distance between two mixes: the share of tasks that would have to change kind."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def sampling_shift(m: dict[str, float], n: int) -> float:
    """The total variation distance from ``m`` of ``n`` tasks drawn from ``m``, expected: each kind's share is
    off by about its standard deviation times sqrt(2/pi) (the normal approximation). Twenty kinds in equal shares
    and 120 held-out tasks give 0.16: a held-out set that small looks 16% unlike its own source."""
    return 0.5 * sum(math.sqrt(2 * p * (1 - p) / (math.pi * n)) for p in m.values()) if n else 0.0


def _shares(m: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in m.items())


def data_report(*, train: list[Task], held_out: list[Task], validation: list[Task], train_n: int | None,
                eval_n: int | None, draws: int, hint: str = "") -> list[str]:
    """Lines for the run's log: the splits, then ``warning:`` lines. ``train_n`` / ``eval_n``: what
    ``data.train.n`` / ``data.eval.n`` asked for (None: no bound); ``draws``: training tasks the run's
    steps take (steps x tasks a step); ``hint``: how to get more tasks from this source."""
    n_train = len(train) + len(validation)  # the validation split is drawn from the training tasks
    a, b = mix(train), mix(held_out)
    lines = [f"data: {len(train)} training tasks" + (f" ({_shares(a)})" if a else "")
             + (f", {len(validation)} held back for validation" if validation else "")
             + f", {len(held_out)} held-out" + (f" ({_shares(b)})" if b else "")]
    if train and draws:  # the steps take tasks in epochs over a shuffle: none repeats before all have come
        each = "no task drawn twice" if draws <= len(train) else f"{draws / len(train):.1f} per task"
        lines.append(f"data: {draws:,} training draws ({each})")
    for key, asked, got, why in (("data.train.n", train_n, n_train, " once the held-out questions are removed"),
                                 ("data.eval.n", eval_n, len(held_out), "")):
        if asked is not None and got < asked:
            lines.append(f"warning: {key} asks for {asked:,} tasks; the source gives {got:,}{why}"
                         f"{'. ' + hint if hint else ''}. Set {key}: {got} to say so, or give the source more tasks")
    apart, noise = shift(a, b), sampling_shift(a, len(held_out))
    if a and b and apart > max(SHIFT_WARN, NOISE_TIMES * noise):
        lines.append(f"warning: the training tasks are mixed unlike the held-out ones ({apart:.0%} of tasks "
                     f"would have to change kind, where drawing {len(held_out)} held-out tasks from the training mix "
                     f"gives about {noise:.0%}): training {_shares(a)}; held-out {_shares(b)}. Held-out figures "
                     f"average over the held-out mix; compare runs on the same held-out set"
                     f"{'. ' + hint if hint else ''}")
    return lines
