"""The RAG workflow in Python and as a YAML graph, on the real (tiny random) model and the same seed:
the same calls, completions, tool calls and answers, sampled at temperature 1."""

import asyncio

from tinycfg import prepared_trainer, tiny_config


def _traces(name, tmp_path):
    data = tiny_config(name, tmp_path / name, steps=1)
    for a in data["agents"].values():
        a["max_new_tokens"] = 12
        a["temperature"] = 1.0
    tr, _, _ = prepared_trainer(data, tmp_path / name)
    traces = asyncio.run(tr._rollout(tr.eval_tasks, 2, train=False, temperature=None, label="t", seed=11))
    return sorted(traces, key=lambda t: (t.task_id, t.sample_idx))


def test_python_and_graph_rag_give_the_same_traces(tmp_path):
    py, graph = _traces("qa/rag_shared", tmp_path), _traces("qa/rag_graph", tmp_path)
    assert len(py) == len(graph) == 6

    def shape(t):
        return ([(c.agent, c.turn, c.messages, c.completion) for c in t.calls],
                [(x.name, x.turn, x.args, x.result) for x in t.tool_calls], t.final_answer)

    assert [shape(t) for t in py] == [shape(t) for t in graph]
    assert len({c.completion for t in py for c in t.calls}) > 3  # sampled text, not one repeated string
