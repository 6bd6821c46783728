"""The calculator tool and the checked math team (solver, checker with the calculator, finalizer), by hand."""

import asyncio
from types import SimpleNamespace

import pytest

from masrl.agents import AgentSpec
from masrl.data.tasks import Task
from masrl.driver.rollout.context import WorkflowContext
from masrl.families.math.checked import MathChecked
from masrl.families.math.solver import MathSolver
from masrl.tools.base import ToolUseError, run_tool
from masrl.tools.calculator import calculate, calculator_tool, show
from masrl.trace import Trace


@pytest.mark.parametrize("text, want", [("47 + 38", 85), ("(5 x 6) + 3", 33), ("9 × 4 - 2", 34), ("1,200 - 7", 1193),
                                        ("12 / 4 = 3", 3), ("-3 + 10", 7), ("7 // 2", 3), ("10 / 4", 2.5)])
def test_the_calculator_computes_what_a_model_writes(text, want):
    assert calculate(text) == want


@pytest.mark.parametrize("text, why", [("2 ** 64", "allowed"), ("__import__('os').system('x')", "allowed"),
                                       ("abs(-3)", "allowed"), ("seven plus two", "not an arithmetic"),
                                       ("5 / 0", "division by zero"), ("", "empty"), ("9" * 20 + " * 9", "range"),
                                       ("1 + " * 60 + "1", "longer")])
def test_the_calculator_refuses_anything_else_with_the_reason(text, why):
    with pytest.raises(ToolUseError, match=why):
        calculate(text)


def test_the_tool_shows_whole_numbers_without_a_point_and_returns_use_errors_to_the_model():
    assert show(85.0) == "85" and show(2.5) == "2.5"
    tool = calculator_tool()
    ok = asyncio.run(run_tool(tool, {"expression": "6 * 7"}))
    bad = asyncio.run(run_tool(tool, {"expression": "6 ** 7"}))
    assert (ok.ok, ok.value) == (True, "42") and not bad.ok and "allowed" in bad.error


class Scripted:
    def __init__(self, outputs):
        self.outputs = outputs

    async def __call__(self, agent, gen):
        return SimpleNamespace(text=self.outputs[agent], n_prompt_tokens=10, n_completion_tokens=5,
                               finish_reason="stop")


def run_team(solver, expr, final):
    wf = MathChecked()
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    outputs = {"solver": f"<solution>work</solution><answer>{solver}</answer>", "checker": f"<expr>{expr}</expr>",
               "finalizer": f"<answer>{final}</answer>"}
    trace = Trace("t", "q1", 0)
    ctx = WorkflowContext(trace, agents, Scripted(outputs), train=True, call_timeout_s=30,
                          tools=wf.tools(None))
    task = Task("q1", "Tom has 47 coins and gets 38 more. How many coins does Tom have now?", "85")
    asyncio.run(wf.run(task, ctx))
    trace.metrics.update(wf.score(trace, task))
    return {c.agent: c.credit for c in trace.calls}, trace


@pytest.mark.parametrize("solver, expr, final, credit, agree", [
    (83, "47 + 38", 85, {"solver": 0.0, "checker": 1.0, "finalizer": 1.0}, 0.0),  # the calculator's answer taken
    (83, "47 + 38", 83, {"solver": 0.0, "checker": 1.0, "finalizer": 0.0}, 0.0),  # the solver's kept: wrong
    (85, "47 - 38", 85, {"solver": 1.0, "checker": 0.0, "finalizer": 1.0}, 0.0),
    (85, "47 + 38", 85, {"solver": 1.0, "checker": 1.0, "finalizer": 1.0}, 1.0),
    (85, "forty seven", 85, {"solver": 1.0, "checker": 0.0, "finalizer": 1.0}, 0.0),  # nothing computed
])
def test_each_agent_of_the_checked_team_is_paid_for_its_own_job(solver, expr, final, credit, agree):
    got, trace = run_team(solver, expr, final)
    assert got == credit
    assert trace.metrics["outcome"] == credit["finalizer"] and trace.metrics["agree"] == agree
    assert trace.metrics["checker/accuracy"] == credit["checker"]
    assert [t.name for t in trace.tool_calls] == (["calculator"] if expr else [])


def test_the_finalizer_is_shown_both_answers_and_a_failed_calculation_says_why():
    wf = MathChecked()
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    async def submit(agent, gen):
        text = {"solver": "<solution>47 + 38 = 83</solution><answer>83</answer>", "checker": "<expr>47 ** 38</expr>",
                "finalizer": "<answer>83</answer>"}[agent]
        return SimpleNamespace(text=text, n_prompt_tokens=10, n_completion_tokens=5, finish_reason="stop")

    trace = Trace("t", "q1", 0)
    ctx = WorkflowContext(trace, agents, submit, train=True, call_timeout_s=30, tools=wf.tools(None))
    asyncio.run(wf.run(Task("q1", "Tom has 47 coins and gets 38 more.", "85"), ctx))
    final_prompt = trace.calls[-1].messages[-1]["content"]
    assert "Solver: 47 + 38 = 83, answer 83" in final_prompt
    assert "could not compute '47 ** 38'" in final_prompt and "allowed" in final_prompt


@pytest.mark.parametrize("solution, stated, want", [("47 + 38 = 83", "83", "85"), ("I add them", "83", "83"),
                                                    ("47 + 38", "85", "85")])
def test_one_solver_with_the_calculator_answers_with_its_computed_calculation(solution, stated, want):
    wf = MathSolver(calculator=True)
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}

    async def submit(agent, gen):
        return SimpleNamespace(text=f"<solution>{solution}</solution><answer>{stated}</answer>", n_prompt_tokens=10,
                               n_completion_tokens=5, finish_reason="stop")

    trace = Trace("t", "q1", 0)
    ctx = WorkflowContext(trace, agents, submit, train=True, call_timeout_s=30, tools=wf.tools(None))
    task = Task("q1", "Tom has 47 coins and gets 38 more.", "85")
    asyncio.run(wf.run(task, ctx))
    assert trace.final_answer == want
    assert wf.score(trace, task)["outcome"] == float(want == "85")
    assert MathSolver().tools(None) == {}


@pytest.mark.parametrize("text, want", [("<expr>47 + 38</expr>", "85"), ("<expr>47 ** 38</expr>", None),
                                        ("the answer is 85", None)])
def test_the_expression_style_solver_is_prompted_as_the_checker_and_answers_with_the_calculators_value(text, want):
    from masrl.families.math import roles as P

    wf = MathSolver(calculator=True, style="expression")
    agents = {n: AgentSpec(n, "p", r.parser) for n, r in wf.roles().items()}
    seen = []

    async def submit(agent, gen):
        seen.append(gen)
        return SimpleNamespace(text=text, n_prompt_tokens=10, n_completion_tokens=5, finish_reason="stop")

    trace = Trace("t", "q1", 0)
    ctx = WorkflowContext(trace, agents, submit, train=True, call_timeout_s=30, tools=wf.tools(None))
    task = Task("q1", "Tom has 47 coins and gets 38 more.", "85")
    asyncio.run(wf.run(task, ctx))
    assert trace.final_answer == want  # no number of its own: a failed expression answers nothing
    assert trace.calls[0].messages[0]["content"] == P.CHECKER_SYSTEM
    assert trace.calls[0].format_ok == (text.startswith("<expr>"))
    assert wf.score(trace, task)["outcome"] == float(want == "85")


def test_the_expression_style_needs_the_calculator_and_a_known_style_is_asked_by_name():
    with pytest.raises(ValueError, match="needs calculator: true"):
        MathSolver(style="expression")
    with pytest.raises(ValueError, match="'solution' or 'expression', got 'expr'"):
        MathSolver(calculator=True, style="expr")
