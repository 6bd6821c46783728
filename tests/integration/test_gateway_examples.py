"""The two shipped outside teams train unchanged: the plain openai-client team and the LangGraph
graph with a LoRA adapter per agent, each run as the user's own program with OPENAI_BASE_URL set."""

import asyncio

import pytest
from tinycfg import prepared_trainer, tiny_config


def test_the_langgraph_team_trains_each_agent_on_its_own_adapter(tmp_path):
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    data = tiny_config("external_langgraph_lora", tmp_path, steps=1)
    tr, workers, before = prepared_trainer(data, tmp_path)
    assert workers["planner"] is workers["solver"] and workers["planner"].host.is_lora  # one base, two adapters
    rec = asyncio.run(tr.train_step())
    traces = tr._last_traces
    assert rec["rollout"]["failed"] == 0 and all([c.agent for c in t.calls] == ["planner", "solver"] for t in traces)
    n = len(traces)
    assert rec["policies"]["planner"]["n_seqs"] == n and rec["policies"]["solver"]["n_seqs"] == n
    after = {p: workers[p].fingerprint(p) for p in ("planner", "solver")}
    assert after["planner"] != before["planner"] and after["solver"] != before["solver"]
    asyncio.run(tr.rt.controller.aclose())
