"""The plan-code-verify-reflect workflow: parsers, credit, feedback, tools, and the task generator."""

import asyncio

import pytest

from masrl.agents import AgentSpec
from masrl.config import SandboxConfig
from masrl.data.test_spec import TestSpec as Spec
from masrl.driver.rollout.context import WorkflowContext
from masrl.driver.rollout.services import Services
from masrl.errors import InfraError
from masrl.families.code.code_gen import generate
from masrl.families.code.roles import feedback, parse_code, parse_plan, parse_reflection
from masrl.families.code.team import CodeSolver, CodeTeam
from masrl.rewards import CreditReward, combine
from masrl.tools.base import Tool, ToolUseError, run_tool, tool
from masrl.trace import Trace


def test_code_parser_gives_credit_in_thirds():
    good = parse_code("<code>def f(x):\n    return x + 1</code>")
    assert good.ok and good.score == 1.0 and good.fields["code"].startswith("def f")
    no_def = parse_code("<code>x = 1</code>")
    assert not no_def.ok and no_def.score == pytest.approx(2 / 3)
    broken = parse_code("<code>def f(:\n</code>")
    assert broken.score == pytest.approx(1 / 3)
    fenced = parse_code("```python\ndef f(x):\n    return x\n```")  # no tag: code still found, format not ok
    assert fenced.fields["code"].startswith("def f") and not fenced.ok
    assert parse_code("I do not know").score == 0.0


def test_plan_and_reflection_parsers():
    assert parse_plan("<plan>use max</plan>").ok
    assert not parse_plan("use max").ok
    assert parse_reflection("<reflection>off by one</reflection>").fields["reflection"] == "off by one"
    assert parse_reflection("<reflection></reflection>").score < 1.0


def test_generator_is_seeded_and_hides_tests():
    a, b = generate(20, seed=3, levels=[1, 2]), generate(20, seed=3, levels=[1, 2])
    assert [t.question for t in a] == [t.question for t in b]
    assert generate(5, seed=4)[0].question != a[0].question or generate(5, seed=4)[1].question != a[1].question
    for t in a:
        assert len(t.answer.cases) == 6 and len(t.meta["visible_tests"].cases) == 2
        assert t.meta["visible_tests"].cases == t.answer.cases[:2]
    held = {t.question for t in a}
    assert not held & {t.question for t in generate(50, seed=5, levels=[1, 2], exclude=held)}


def test_feedback_shows_visible_cases_only():
    result = {"pass_rate": 0.25, "all_passed": False, "first_failure": "x",
              "cases": [["OK", ""], ["WA", "f(*[2]): expected 4, got 3"], ["WA", "f(*[9]): expected 81, got 8"],
                        ["OK", ""]]}
    text = feedback(result, visible=2)
    assert "expected 4" in text and "expected 81" not in text and "hidden" not in text
    blind = feedback(result, visible=None)
    assert "expected" not in blind and "2 of 4 tests failed (WA)" in blind


# --- the workflow on hand-written model outputs: credit by hand ------------------------------------

class Scripted:
    """Stands in for the engines: returns prepared completions per agent, in order."""

    def __init__(self, outputs: dict[str, list[str]]):
        self.outputs = {k: list(v) for k, v in outputs.items()}

    async def __call__(self, agent, gen):
        from types import SimpleNamespace

        text = self.outputs[agent].pop(0)
        return SimpleNamespace(text=text, n_prompt_tokens=10, n_completion_tokens=5, finish_reason="stop")


def _agents(names):
    roles = CodeTeam().roles()
    return {n: AgentSpec(n, "p", roles[n].parser) for n in names}


def _run(workflow, task, outputs, tools):
    trace = Trace("t", task.id, 0)
    ctx = WorkflowContext(trace, _agents(workflow.roles()), Scripted(outputs), train=True, call_timeout_s=30,
                          tools=tools)
    asyncio.run(workflow.run(task, ctx))
    trace.metrics.update(workflow.score(trace, task))
    return trace


def _linear_task():
    """The first generated task of the form add_k / times_k / minus_k (its solution is one expression)."""
    return next(t for t in generate(40, seed=1, levels=[1]) if t.meta["fn_name"].partition("_")[0] in ("add", "times", "minus"))


def test_credit_follows_the_pass_rate_turn_by_turn():
    task = _linear_task()
    fn = task.meta["fn_name"]
    wrong = f"<code>def {fn}(x):\n    return 0</code>"
    ref = {"add": "x + {k}", "times": "x * {k}", "minus": "x - {k}"}
    kind, _, k = fn.partition("_")
    assert kind in ref, f"seed 1 gives first task is {fn}; pick a seed whose first task is add/times/minus"
    right = f"<code>def {fn}(x):\n    return {ref[kind].format(k=k)}</code>"
    services = Services(SandboxConfig())
    wf = CodeTeam(max_turns=2)
    tr = _run(wf, task, {"planner": ["<plan>do it</plan>"], "coder": [wrong, right],
                         "reflector": ["<reflection>return the real value</reflection>"]}, wf.tools(services))
    calls = {(c.agent, c.turn): c for c in tr.calls}
    planner, coder0, refl, coder1 = tr.calls
    assert [c.agent for c in tr.calls] == ["planner", "coder", "reflector", "coder"]
    p0 = coder0.turn_score  # "return 0" passes only the cases whose answer is 0
    assert coder0.credit == pytest.approx(p0)
    assert coder1.turn_score == 1.0 and coder1.credit == pytest.approx(1.0 - p0)
    assert refl.credit == pytest.approx(1.0 - p0)  # the change its reflection produced
    assert planner.credit == 1.0
    assert tr.metrics["outcome"] == 1.0 and tr.metrics["turns_to_success"] == 2.0
    assert [t.name for t in tr.tool_calls] == ["run_tests", "run_tests"]
    assert tr.tool_calls[0].turn == 2 and tr.tool_calls[1].turn == 4  # after the call that wrote the code
    totals = combine(tr, task, [CreditReward()])
    assert totals[coder1.call_id] == pytest.approx(1.0 - p0) and totals[planner.call_id] == 1.0
    assert calls[("reflector", 2)].reward_parts == {"credit": pytest.approx(1.0 - p0)}


def test_the_loop_stops_once_every_test_passes():
    task = _linear_task()
    fn = task.meta["fn_name"]
    kind, _, k = fn.partition("_")
    expr = {"add": "x + {k}", "times": "x * {k}", "minus": "x - {k}"}[kind].format(k=k)
    wf = CodeTeam(max_turns=3)
    tr = _run(wf, task, {"planner": ["<plan>p</plan>"], "coder": [f"<code>def {fn}(x):\n    return {expr}</code>"],
                         "reflector": []}, wf.tools(Services(SandboxConfig())))
    assert [c.agent for c in tr.calls] == ["planner", "coder"]
    assert tr.metrics["turns_to_success"] == 1.0 and "reflector/gain" not in tr.metrics


def test_hidden_cases_score_but_never_make_the_team_try_again():
    task = _linear_task()
    fn = task.meta["fn_name"]
    visible = task.meta["visible_tests"].cases
    # passes exactly the visible cases: a lookup of their inputs, 0 for any other input
    table = {c["args"][0]: c["expected"] for c in visible}
    code = f"<code>def {fn}(x):\n    return {table!r}.get(x, 0)</code>"
    wf = CodeTeam(max_turns=3, plan=False)
    tr = _run(wf, task, {"coder": [code], "reflector": []}, wf.tools(Services(SandboxConfig())))
    assert [c.agent for c in tr.calls] == ["coder"]  # the visible tests passed: no retry
    assert tr.metrics["pass_rate"] < 1.0 and tr.metrics["all_passed"] == 0.0  # the hidden ones still score


def test_a_program_that_fails_is_a_result_but_a_dead_sandbox_drops_the_trace():
    task = generate(1, seed=1, levels=[1])[0]
    wf = CodeSolver()
    tr = _run(wf, task, {"coder": ["<code>raise SystemExit(3)</code>"]}, wf.tools(Services(SandboxConfig())))
    assert tr.metrics["outcome"] == 0.0 and tr.tool_calls[0].error is None and not tr.tool_calls[0].infra

    async def dead(code: str, tests: Spec) -> dict:
        raise ConnectionError("sandbox host unreachable")

    with pytest.raises(InfraError, match="sandbox host unreachable"):
        _run(wf, task, {"coder": ["<code>def f(): pass</code>"]}, {"run_tests": Tool.from_function(dead)})


def test_tools_get_a_schema_checked_arguments_and_a_timeout():
    @tool(description="Look something up", timeout_s=0.2)
    def lookup(query: str, k: int = 3) -> list:
        if not query:
            raise ToolUseError("empty query")
        return [query] * k

    assert lookup.spec()["function"]["parameters"] == {
        "type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}}, "required": ["query"]}
    assert asyncio.run(run_tool(lookup, {"query": "a", "k": 2})).value == ["a", "a"]
    assert "must be a integer" in asyncio.run(run_tool(lookup, {"query": "a", "k": "2"})).error
    assert "takes no argument(s) q" in asyncio.run(run_tool(lookup, {"q": "a", "query": "b"})).error
    assert asyncio.run(run_tool(lookup, {"query": ""})).error == "empty query"

    import threading
    import time

    release = threading.Event()

    @tool(timeout_s=0.2)
    def slow(x: int) -> int:
        release.wait(timeout=60)  # held until the test lets it go: far past its time limit
        return x

    async def both():  # a slow sync tool runs in a thread: the loop keeps serving others meanwhile
        t0 = time.perf_counter()
        ticks = 0
        call = asyncio.ensure_future(run_tool(slow, {"x": 1}))
        while not call.done():
            ticks += 1
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
        release.set()
        return call.exception() or call.result(), ticks, elapsed

    res, ticks, elapsed = asyncio.run(both())
    assert type(res).__name__ == "ToolInfraError" and "within 0.2s" in str(res)
    assert ticks >= 2 and elapsed < 30  # answered at its limit, not when the tool let go


def test_the_single_coder_with_tests_sees_the_team_coders_feedback_and_tries_again_itself():
    task = _linear_task()
    fn = task.meta["fn_name"]
    kind, _, k = fn.partition("_")
    body = {"add": "x + {k}", "times": "x * {k}", "minus": "x - {k}"}[kind].format(k=k)
    right = f"<code>def {fn}(x):\n    return {body}</code>"
    wrong = f"<code>def {fn}(x):\n    return 0</code>"
    services = Services(SandboxConfig())
    wf = CodeSolver(max_turns=2)
    tr = _run(wf, task, {"coder": [wrong, right]}, wf.tools(services))
    assert [c.agent for c in tr.calls] == ["coder", "coder"]  # no reviewer: the same coder, twice
    retry = tr.calls[1].messages[-1]["content"]
    assert "Your previous code:" in retry and "return 0" in retry and "expected" in retry
    assert [c.credit for c in tr.calls] == [0.0, 1.0]  # turn 0 its rate, the retry the change it made
    assert tr.metrics["pass_rate_turn0"] == 0.0 and tr.metrics["outcome"] == 1.0 and tr.metrics["turns_to_success"] == 2.0
    once = CodeSolver()  # the default never shows a test and never retries
    tr1 = _run(once, task, {"coder": [wrong, right]}, once.tools(services))
    assert len(tr1.calls) == 1 and tr1.metrics["outcome"] == 0.0 and "turns_to_success" not in tr1.metrics
    passed = _run(wf, task, {"coder": [right, wrong]}, wf.tools(services))
    assert len(passed.calls) == 1 and passed.metrics["turns_to_success"] == 1.0  # visible tests passed: no retry
    with pytest.raises(ValueError, match="at least 1"):
        CodeSolver(max_turns=0)
