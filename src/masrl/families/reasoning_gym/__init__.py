"""The reasoning-gym library's procedural datasets, unchanged (``source: reasoning_gym``), every answer scored by
the library; one solver, one solver with a calculator, and the checked team (docs/field_tasks.md)."""

from __future__ import annotations

from masrl.data.sources import Source, SourceSpec
from masrl.families.reasoning_gym import tasks
from masrl.families.reasoning_gym.workflows import ReasoningGymChecked, ReasoningGymSolver


def _reasoning_gym(s: SourceSpec):
    return tasks.generate(s.n or 1000, seed=s.seed, options=s.options, exclude=s.exclude)


WORKFLOWS = {"rg_solver": ReasoningGymSolver, "rg_checked": ReasoningGymChecked}
SOURCES = {"reasoning_gym": Source(_reasoning_gym, levels=(1,), options=tasks.parse_options,
                                   more="A dataset's config bounds its distinct questions: widen its difficulty knobs")}
