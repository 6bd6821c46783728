"""Writing Python functions, tested in the sandbox: seeded function-writing tasks (``code_gen``) and the same
functions under invented names with their documentation entry among others' (``code_docs``); the code teams
(plan-code-verify-reflect, code-test-review), the documentation readers' team, and their single coders."""

from __future__ import annotations

from masrl.data.sources import Source, SourceSpec
from masrl.errors import ConfigError
from masrl.families.code import code_gen, docs_tasks
from masrl.families.code.docs import CodeDocsAgent, CodeDocsTeam
from masrl.families.code.tasks import code_task, load_humaneval
from masrl.families.code.team import CodeSolver, CodeTeam


def _code_gen(s: SourceSpec):
    return code_gen.generate(s.n or 1000, seed=s.seed, levels=list(s.levels), exclude=set(s.exclude))


def _code_docs(s: SourceSpec):
    if s.world.context_docs < 2:
        raise ConfigError(f"data.world.context_docs: source 'code_docs' shows each task's function among others' "
                          f"documentation entries and needs at least 2 of them a task (24 in the shipped configs); "
                          f"got {s.world.context_docs}")
    return docs_tasks.generate(s.n or 1000, seed=s.seed, levels=list(s.levels), docs=s.world.context_docs,
                               exclude=set(s.exclude))


def _humaneval(s: SourceSpec):
    return load_humaneval()[: s.n]


WORKFLOWS = {"code_team": CodeTeam, "code_solver": CodeSolver, "code_docs_team": CodeDocsTeam,
             "code_docs_agent": CodeDocsAgent}
SOURCES = {"code_gen": Source(_code_gen, levels=(1, 2), more="code_gen's function families hold about 440 distinct "
                                                             "tasks at levels 1-2"),
           "code_docs": Source(_code_docs, levels=(1, 2), more="code_docs invents a new function name for every "
                                                               "task: raise n"),
           "humaneval": Source(_humaneval, more="HumanEval has 164 problems")}
ROW_KINDS = {"code": code_task}  # a file's code rows: a prompt and its tests
