"""The two shipped outside teams train unchanged: the plain openai-client team and the LangGraph
graph with a LoRA adapter per agent, each run as the user's own program with OPENAI_BASE_URL set."""

import asyncio

import pytest
from tinycfg import prepared_trainer, run_async, tiny_config

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def test_the_langgraph_team_trains_each_agent_on_its_own_adapter(tmp_path):
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    data = tiny_config("examples/external_langgraph_lora.yaml", tmp_path, steps=1)
    tr, workers, before = prepared_trainer(data, tmp_path)
    assert workers["planner"] is workers["solver"] and workers["planner"].held.is_lora  # one base, two adapters
    rec = asyncio.run(tr.train_step())
    traces = tr.last_traces
    assert rec["rollout"]["failed"] == 0 and all([c.agent for c in t.calls] == ["planner", "solver"] for t in traces)
    n = len(traces)
    assert rec["policies"]["planner"]["n_seqs"] == n and rec["policies"]["solver"]["n_seqs"] == n
    after = {p: workers[p].fingerprint(p) for p in ("planner", "solver")}
    assert after["planner"] != before["planner"] and after["solver"] != before["solver"]
    asyncio.run(tr.rt.controller.aclose())


def test_the_langgraph_team_trains_in_async_mode_with_adapters_published_from_a_copy(tmp_path):
    """rollout.mode async with the gateway's outside agents and a LoRA adapter per agent: the user's
    graph keeps calling while the adapters update (the engine samples a copy that shares the base),
    every finished call trains once, and both adapters change."""
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")

    data = tiny_config("examples/external_langgraph_lora.yaml", tmp_path, steps=3)
    data["rollout"].update(mode="async", overlap_update=True)
    tr, workers, before = prepared_trainer(data, tmp_path)
    w = workers["planner"]
    live = dict(w.held.model.named_parameters())
    shared = [n for n, p in w.sampler.copy.model.named_parameters() if p.data_ptr() == live[n].data_ptr()]
    assert shared and all("lora_" not in n for n in shared)  # the base is not copied

    recs, traces = run_async(tr, 3)
    assert all(r["rollout"]["failed"] == 0 for r in recs)
    for p in ("planner", "solver"):
        assert sum(r["policies"][p]["n_seqs"] for r in recs) == sum(1 for t in traces for c in t.calls if c.agent == p)
        assert w.fingerprint(p) != before[p]
    assert max(c.policy_version for t in traces for c in t.calls) >= 1  # later episodes: published adapters
