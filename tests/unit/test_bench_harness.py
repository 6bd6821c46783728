"""The benchmarks' shared module: its hash rewards, and that no benchmark reaches into tests/ or edits its path."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from masrl.data.tasks import Task
from masrl.trace import Call, Trace

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _harness():
    spec = importlib.util.spec_from_file_location("harness", BENCH / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["harness"] = mod  # as a benchmark script imports it (its dataclasses need their module)
    spec.loader.exec_module(mod)
    return mod


def _trace(task_id: str, texts: list[tuple[str, str]]) -> Trace:
    tr = Trace("tr", task_id, 0)
    for i, (agent, text) in enumerate(texts):
        tr.calls.append(Call(f"c{i}", "tr", task_id, 0, agent, "p", i, [], completion=text))
    return tr


def test_the_hash_rewards_are_deterministic_and_vary_by_text_task_and_agent():
    h = _harness()
    texts = [("solver", f"answer {i}") for i in range(12)] + [("verifier", "ok")]
    a = h.agent_hash_reward().allocate(_trace("t1", texts), Task("t1", "q", None, {}))
    again = h.agent_hash_reward().allocate(_trace("t1", texts), Task("t1", "q", None, {}))
    assert [r.reward for r in a] == [r.reward for r in again]
    assert len({r.reward for r in a}) > 5 and all(0.0 <= r.reward < 1.0 for r in a)
    only = h.agent_hash_reward(agents=["verifier"]).allocate(_trace("t1", texts), Task("t1", "q", None, {}))
    assert [r.call_id for r in only] == ["c12"]
    same = [("solver", "same")] * 2
    one = h.task_hash_reward().allocate(_trace("t1", same), Task("t1", "q", None, {}))
    two = h.task_hash_reward().allocate(_trace("t2", same), Task("t2", "q", None, {}))
    assert one[0].reward == one[1].reward and one[0].reward != two[0].reward  # a repeated text differs between tasks


def test_no_benchmark_edits_its_path_or_imports_the_tests():
    offenders = [f"{p.name}:{i + 1}" for p in sorted(BENCH.glob("*.py"))
                 for i, line in enumerate(p.read_text().splitlines())
                 if "sys.path.insert" in line or re.search(r"\b(helpers|tinycfg|bench_gpu):", line)
                 or re.match(r"\s*(import bench_gpu|from bench_gpu|from helpers|import helpers)\b", line)]
    assert offenders == []


BENCHMARKS = sorted(p.name for p in BENCH.glob("*.py"))


def test_every_benchmark_imports_and_every_masrl_name_it_reaches_for_exists(monkeypatch):
    """Benchmarks run on the GPU host, not in CI; a redesign that moves or renames what they import (also inside
    their functions, where most import masrl's internals) fails here instead of on the next GPU call."""
    import ast
    import importlib

    monkeypatch.syspath_prepend(str(BENCH))  # as `python benchmarks/NAME.py` runs it: its siblings importable
    missing = []
    for name in BENCHMARKS:
        path = BENCH / name
        importlib.import_module(path.stem)  # its module level runs
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "masrl":
                mod = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(mod, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{name}: from {node.module} import {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "masrl":
                        importlib.import_module(alias.name)
    assert len(BENCHMARKS) > 20 and not missing, missing


def test_bench_verl_reads_verls_console_lines_and_masrls_metrics(tmp_path, monkeypatch):
    import json as _json

    monkeypatch.syspath_prepend(str(BENCH))
    import bench_verl

    log = ("(TaskRunner pid=1) step:0 - val-core/arithmetic/reward/mean@1:0.125\n"
           "(TaskRunner pid=1) step:1 - actor/pg_loss:0.01 - timing_s/gen:3.5 - timing_s/update_actor:1.25 - "
           "timing_s/update_weights:0.5 - timing_s/step:5.5 - perf/max_memory_allocated_gb:7.25\n"
           "(TaskRunner pid=1) step:2 - timing_s/step:4.5 - timing_s/gen:3.0 - val-core/arithmetic/reward/mean@1:0.25\n")
    got = bench_verl.parse_verl(log)
    assert got["evals"] == {0: 0.125, 2: 0.25}
    assert got["steps"][0] == {"step": 1, "s": 5.5, "rollout_s": 3.5, "update_s": 1.25, "sync_s": 0.5,
                               "old_logprob_s": None, "peak_gib": 7.25}
    (tmp_path / "metrics.jsonl").write_text("\n".join(_json.dumps(r) for r in [
        {"step": 0, "eval": "before", "outcome": 0.1},
        {"step": 1, "rollout": {}, "rollout_s": 2.0, "update_s": 0.5, "gpu_peak_gib": 6.0},
        {"step": 1, "eval": "every", "outcome": 0.3}]))
    m = bench_verl.parse_masrl(tmp_path)
    assert m == {"steps": [{"step": 1, "s": 2.5, "rollout_s": 2.0, "update_s": 0.5, "peak_gib": 6.0}],
                 "evals": {0: 0.1, 1: 0.3}}
    rows = [{"side": "verl", "seed": 0, "card_peak_gib": 30.0, **got}, {"side": "masrl", "seed": 0, "card_peak_gib": 9.0, **m}]
    table = bench_verl.table(rows)
    assert "| verl | 0 | 2 | 4.50 | 3.00 |" in table and "| masrl | 0 | 1 | 2.50 |" in table


def test_verl_coin_loads_as_verl_loads_it_and_both_sides_pay_the_same():
    """verl imports a custom reward file by path without putting it in sys.modules (where a dataclass fails to build:
    the H100 run of 2026-12-07 died of it); masrl's CoinReward and verl's compute_score give a reply the same reward."""
    spec = importlib.util.spec_from_file_location("custom_module", BENCH / "verl_coin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # not registered in sys.modules, as verl's load_extern_object does
    texts = [("solver", f"reply {i}") for i in range(32)]
    paid = mod.CoinReward().allocate(_trace("t1", texts), Task("t1", "q", None, {}))
    assert [r.reward for r in paid] == [mod.compute_score("arithmetic", t, "7") for _, t in texts]
    assert {r.reward for r in paid} == {0.0, 1.0}


def test_bench_verl_reads_verl_0_9_1_s_step_line_as_it_printed_it_on_the_h100():
    spec = importlib.util.spec_from_file_location("bench_verl", BENCH / "bench_verl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    line = ("\x1b[36m(TaskRunnerV1 pid=17333)\x1b[0m step:1 - actor/pg_loss:0.001 - "
            "actor/perf/max_memory_allocated_gb:7.55 - timing_s/gen:12.1 - timing_s/old_log_prob:20.8 - "
            "timing_s/update_actor:70.0 - timing_s/update_weights:0.25 - timing_s/step:131.5 - "
            "val-core/arithmetic/reward/mean@1:0.25 - num_turns/min:np.int32(2)")
    got = mod.parse_verl("noise\n" + line + "\n")
    assert got["steps"] == [{"step": 1, "s": 131.5, "rollout_s": 12.1, "update_s": 70.0, "sync_s": 0.25,
                             "old_logprob_s": 20.8, "peak_gib": 7.55}]
    assert got["evals"] == {1: 0.25}
