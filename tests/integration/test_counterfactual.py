"""Counterfactual credit: a call earns its trace's outcome minus the mean outcome of its trace re-run
from that call with the call resampled; the prefix is replayed, not sampled; the cost is reported."""

import asyncio
import zlib

import pytest
from tinycfg import prepared_trainer, tiny_config

from masrl.agents import AgentRole
from masrl.config import load_config
from masrl.driver.run.sync_step import branch_points, credit_from_branches
from masrl.errors import ConfigError
from masrl.parsing import ParseResult
from masrl.trace import Call, Trace


def raw(text):
    return ParseResult(ok=True, score=1.0, fields={"text": text})


class Relay:
    """a -> b -> c; the outcome is a parity of c's text, so resampling any call can change it."""

    name = "relay"

    def roles(self):
        return {n: AgentRole(n, raw, "relays", 6, ()) for n in ("a", "b", "c")}

    async def run(self, task, ctx):
        text = task.question
        for agent in ("a", "b", "c"):
            call = await ctx.call(agent, [{"role": "user", "content": f"{agent}: {text}"}])
            text = call.completion
        ctx.finish(text)

    def score(self, trace, task):
        return {"outcome": float(zlib.crc32(trace.final_answer.encode()) % 2)}


def _data(tmp_path, **cf):
    data = tiny_config("math/team_shared", tmp_path, steps=1)
    data["workflow"] = {"name": "relay"}
    data["agents"] = {n: {"policy": "shared", "max_new_tokens": 6} for n in ("a", "b", "c")}
    data["rewards"] = [{"type": "outcome"}, {"type": "counterfactual"}]
    data["rollout"]["counterfactual"] = {"k": 2, **cf}
    return data


@pytest.fixture()
def relay(monkeypatch):
    import masrl.families as fam

    monkeypatch.setitem(fam.WORKFLOWS, "relay", Relay)


def test_a_branch_replays_the_prefix_and_resamples_the_call(relay, tmp_path):
    tr, _, _ = prepared_trainer(_data(tmp_path), tmp_path)
    ctl = tr.rt.controller
    task = tr.train_tasks[0]

    async def go():
        sem = asyncio.Semaphore(8)
        trace = await ctl.run_episode(task, 0, True, None, sem, seed=7)
        again = await ctl.run_episode(task, 0, True, None, sem, seed=7)
        branches = [await ctl.run_branch(task, trace, 1, a, sem, 7) for a in range(2)]
        return trace, again, branches

    trace, again, branches = asyncio.run(go())
    asyncio.run(ctl.aclose())
    # the seeded sampling gives the same tokens again: replaying the prefix is exact
    assert [c.completion for c in again.calls] == [c.completion for c in trace.calls]
    for br in branches:
        assert br.calls[0].completion == trace.calls[0].completion and br.calls[0].call_id != trace.calls[0].call_id
        assert not any(c.trainable for c in br.calls)
    assert branches[0].calls[1].completion != trace.calls[1].completion  # the branched call: another sample
    assert branches[0].calls[1].completion != branches[1].calls[1].completion  # each alternative its own


def test_credit_and_its_cost_by_hand():
    def trace(tid, outcome, n):
        t = Trace(tid, "q", 0)
        t.calls = [Call(f"{tid}{j}", tid, "q", 0, "a", "p", j, []) for j in range(n)]
        t.metrics["outcome"] = outcome
        return t

    tr = trace("t", 1.0, 3)
    points = branch_points([tr], None, 2)
    assert [(j, a) for _, j, a in points] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    outcomes = [0.0, 1.0, 1.0, 1.0, 0.0, 0.0]  # alternatives of call 0, of call 1, of call 2
    branches = [trace(f"b{i}", o, 3) for i, o in enumerate(outcomes)]
    stats = credit_from_branches(points, branches)
    assert [c.counterfactual for c in tr.calls] == [0.5, 0.0, 1.0]
    assert stats["calls"] == 2 * 3 + 2 * 2 + 2 * 1 and stats["credited_calls"] == 3
    assert stats["mean_abs_credit"] == 0.5 and stats["nonzero_credit"] == pytest.approx(2 / 3)


def test_a_step_pays_counterfactual_credit_and_reports_its_cost(relay, tmp_path):
    tr, _, _ = prepared_trainer(_data(tmp_path, agents=["b"]), tmp_path)
    rec = asyncio.run(tr.train_step())
    cf = rec["counterfactual"]
    n = len(tr.last_traces)
    assert cf["branches"] == 2 * n and cf["credited_calls"] == n and cf["failed_branches"] == 0
    assert cf["calls"] == 2 * n * 2 and cf["rollout_calls"] == 3 * n  # b and c again, twice per trace
    assert cf["nonzero_credit"] > 0  # resampling b changed some outcomes (a parity of c's text)
    for t in tr.last_traces:
        a, b, c = t.calls
        assert a.counterfactual is None and c.counterfactual is None and -1.0 <= b.counterfactual <= 1.0
        assert b.reward_parts["counterfactual"] == b.counterfactual
    # the same seed gives the same credit
    tr2, _, _ = prepared_trainer(_data(tmp_path / "again", agents=["b"]), tmp_path / "again")
    asyncio.run(tr2.train_step())
    assert [t.calls[1].counterfactual for t in tr2.last_traces] == [t.calls[1].counterfactual for t in tr.last_traces]


def test_the_reward_and_the_setting_come_together(tmp_path):
    data = _data(tmp_path)
    data["workflow"] = {"name": "math_team"}
    data["agents"] = {n: {"policy": "shared"} for n in ("solver", "verifier", "refiner", "finalizer")}
    del data["rollout"]["counterfactual"]
    with pytest.raises(ConfigError, match="the counterfactual reward pays credit that rollout.counterfactual computes"):
        load_config(data=data)
    data["rollout"]["counterfactual"] = {"agents": ["verifer"]}
    with pytest.raises(ConfigError, match="rollout.counterfactual.agents: verifer not under `agents`"):
        load_config(data=data)
