"""Functions to write from their documentation: the asked function's entry stands among others'.

Each task asks for one function by an invented name (``Write the Python function `velko(x)` that the
documentation describes.``) and carries ``docs`` documentation entries in ``meta.context``: the asked
function's and ``docs - 1`` others', each an invented name, what it returns (code_gen's function families,
other constants), one worked call and a sentence or two of the notes real API docs carry. The name says
nothing of what the function does, so the coder has to find its entry: with 24 entries one prompt runs to
about 1,600 tokens. Tests as code_gen's: visible cases and hidden ones, the hidden ones only scored.
"""

from __future__ import annotations

import random
import re

from masrl.data.draw import draw_distinct
from masrl.data.tasks import Task
from masrl.families.code.code_gen import call_tests, families, params_of

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gl", "kr", "pl", "st",
           "tr", "sk"]
_VOWELS = ["a", "e", "i", "o", "u"]
_CODAS = ["", "", "", "n", "r", "l", "x", "k", "s"]
_MODULES = ["billing", "reports", "inventory", "ledger", "sync", "export", "calendar", "audit", "shipping", "payroll"]
_NOTES = ["It is part of the {m} module.", "It was added in version {v}.", "It has no side effects.",
          "It does not change its arguments.", "The {m} service calls it on every request.",
          "Its tests live in test_{m}.py.", "It is safe to call from several threads.", "It logs nothing.",
          "The {m} team maintains it.", "It replaced an older helper in version {v}."]
# the names the workflows' worked examples use: never drawn for a task
EXAMPLE_NAMES = frozenset({"pomet", "sarvik", "dulo", "kenbra"})


def invented_name(rng: random.Random) -> str:
    """A made-up identifier of two or three syllables (``velko``, ``trasimun``)."""
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.choice((2, 2, 3))))


def entry(name: str, text: str, params: str, example: list, value: object, notes: list[str]) -> str:
    """One documentation entry: ``name(params): Returns ... For example, name(3) returns 30. <notes>``."""
    call = f"{name}({', '.join(repr(a) for a in example)})"
    return f"{name}({params}): {text[0].upper()}{text[1:]}. For example, {call} returns {value!r}. {' '.join(notes)}"


def _notes(rng: random.Random) -> list[str]:
    m, v = rng.choice(_MODULES), f"{rng.randint(1, 4)}.{rng.randint(0, 9)}"
    return [s.format(m=m, v=v) for s in rng.sample(_NOTES, rng.choice((1, 2, 2, 3)))]


def family_kind(fn_name: str) -> str:
    """code_gen's function name without its constant: ``add_27`` -> ``add``, the task's kind."""
    return re.sub(r"_(\d+|[a-z])$", "", fn_name)


def generate(n: int, *, seed: int = 0, levels: list[int] | tuple[int, ...] = (1,), docs: int = 24, visible: int = 2,
             hidden: int = 4, exclude: set[str] | None = None) -> list[Task]:
    """``n`` tasks, each with ``docs`` entries (the asked function's among others'); the same seed gives the
    same tasks. ``exclude``: questions to skip (held-out ones)."""
    if docs < 2:
        raise ValueError("code_docs needs at least 2 documentation entries a task (the asked function's and another)")
    rng = random.Random(f"code_docs-{seed}")

    def attempt():
        names: list[str] = []
        while len(names) < docs:
            name = invented_name(rng)
            if name not in names and name not in EXAMPLE_NAMES:
                names.append(name)
        name = names[0]
        level = rng.choice(list(levels))
        fn, text, ref, draw = rng.choice(families(rng, level))
        sample = draw(rng)
        params = params_of(sample)
        question = f"Write the Python function `{name}({params})` that the documentation describes."

        def make(k: int) -> Task:
            spec, shown = call_tests(rng, name, ref, draw, visible, hidden)
            example = draw(rng)
            entries = [entry(name, text, params, example, ref(*example), _notes(rng))]
            for other in names[1:]:  # the others: any family of the task's levels, their own constants
                _, o_text, o_ref, o_draw = rng.choice(families(rng, rng.choice(list(levels))))
                o_args = o_draw(rng)
                entries.append(entry(other, o_text, params_of(o_args), o_args, o_ref(*o_args), _notes(rng)))
            rng.shuffle(entries)
            return Task(f"code-docs-{seed}-{k}", question, spec,
                        meta={"fn_name": name, "visible_tests": shown, "level": level, "kind": family_kind(fn),
                              "context": entries, "data_source": "code_docs"})

        return question, make

    return draw_distinct(n, attempt, exclude=exclude or (), max_attempts=n * 50)


def holds(passage: str, task: Task) -> bool:
    """Whether ``passage`` is the asked function's documentation entry."""
    return passage.startswith(f"{task.meta['fn_name']}(")
