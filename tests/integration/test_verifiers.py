"""verifiers environments as a workflow (``workflow: verifiers``): tasksets written to verifiers 0.4's own
interface (tests/verifiers_envs: a single-turn taskset, a calculator tool environment, a two-agent ``Env``), run
by verifiers itself in its own Python (``make verifiers``), every model call through masrl's gateway."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tinycfg import prepared_trainer, step_and_close, tiny_config

from masrl.errors import ConfigError
from masrl.workflows.verifiers import VerifiersWorkflow, verifiers_python

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ENVS = Path(__file__).resolve().parents[1] / "verifiers_envs"
ROOT = Path(__file__).resolve().parents[2]

if subprocess.run([verifiers_python(), "-c", "import verifiers.v1"], capture_output=True).returncode != 0:
    pytest.skip("verifiers is not installed (make verifiers)", allow_module_level=True)


@pytest.fixture(autouse=True)
def _envs_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))


def _config(tmp_path, taskset: str, seats: dict[str, str], **options):
    data = tiny_config("math/solver", tmp_path, steps=1)
    policy = next(iter(data["policies"]))
    data["agents"] = {a: {"policy": policy, "max_new_tokens": 6} for a in seats.values()}
    env = {"taskset": {"id": taskset}}
    data["workflow"] = {"name": "verifiers", "options": {"env": env, "seats": seats, **options}}
    data["data"] = {"train": {"source": "verifiers", "n": 2, "options": {"env": env, "idx": "0:2"}},
                    "eval": {"source": "verifiers", "n": 2, "options": {"env": env, "idx": "2:4"}}}
    data["rewards"] = [{"type": "credit", "weight": 1.0}]
    data["rollout"]["max_failed_fraction"] = 0.0
    return data


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "State:\tZ" not in status  # a killed child not yet reaped is gone


def _traces(tr):
    pid = []
    rec = step_and_close(tr, before_close=lambda t: pid.append(t.rt.workflow._pid))
    assert pid[0] is not None and not _alive(pid[0]), "the verifiers runner outlived the run"
    assert rec["rollout"]["failed"] == 0, rec["rollout"].get("first_error")
    return tr.last_traces


def test_a_single_turn_taskset_is_played_and_scored_by_its_own_reward(tmp_path):
    tr, _, _ = prepared_trainer(_config(tmp_path, "vf_count", {"agent": "solver"}), tmp_path)
    traces = _traces(tr)
    assert traces and all(len(t.calls) == 1 for t in traces)
    for t in traces:
        call = t.calls[0]
        assert call.agent == "solver" and "+ 1? Answer with the number." in call.messages[-1]["content"]
        n = int(call.messages[-1]["content"].split("What is ")[1].split(" ")[0])
        # verifiers' @reward read the same reply masrl sampled: the credit is its verdict on that text
        assert call.credit == (1.0 if str(n + 1) in call.completion else 0.0)
        assert t.state["seat_rewards"] == {"agent": call.credit}


def test_a_tool_environment_offers_its_tools_through_the_gateway(tmp_path):
    tr, _, _ = prepared_trainer(_config(tmp_path, "vf_calc", {"agent": "solver"}), tmp_path)
    traces = _traces(tr)
    assert traces and all(t.calls for t in traces)
    # the calculator went to masrl's gateway as an offered tool in every episode's requests (verifiers records the
    # tools its requests carried), and the gateway took them: each request became a call
    for t in traces:
        assert any(name.endswith("add") for name in t.state["tools"]), t.state["tools"]
    assert all(t.state["seat_rewards"] == {"agent": t.calls[-1].credit} for t in traces)


def test_two_agents_play_their_own_seats_and_each_is_paid_its_own_reward(tmp_path):
    seats = {"proposer": "alice", "checker": "bob"}
    tr, _, _ = prepared_trainer(_config(tmp_path, "vf_duel", seats), tmp_path)
    traces = _traces(tr)
    for t in traces:
        assert [c.agent for c in t.calls] == ["alice", "bob"]
        # the checker saw the proposer's reply, as the environment's run() wrote it
        assert t.calls[0].completion.strip()[:20] in t.calls[1].messages[-1]["content"]
        paid = {s: r for s, r in t.state["seat_rewards"].items()}
        assert {c.agent: c.credit for c in t.calls} == {"alice": paid["proposer"], "bob": paid["checker"]}


def test_what_is_not_a_verifiers_environment_is_refused_before_any_model_loads():
    with pytest.raises(ConfigError, match="no_such_taskset.*could not be loaded.*not found"):
        VerifiersWorkflow(env={"taskset": {"id": "no_such_taskset"}})
    with pytest.raises(ConfigError, match="exports no Taskset subclass"):
        VerifiersWorkflow(env={"taskset": {"id": "json"}})
    with pytest.raises(ConfigError, match="seats are proposer, checker; no agent for checker"):
        VerifiersWorkflow(env={"taskset": {"id": "vf_duel"}}, seats={"proposer": "a"})
    with pytest.raises(ConfigError, match="no Python at"):
        VerifiersWorkflow(env={"taskset": {"id": "vf_count"}}, python="/nonexistent/python")


def test_the_shipped_config_trains_a_step_through_the_cli(tmp_path):
    data = tiny_config("examples/verifiers_arith.yaml", tmp_path / "run", steps=1)
    data["rewards"] = [r for r in data["rewards"] if not r["type"].startswith("helpers:")]  # a test-only module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], capture_output=True, text=True,
                         timeout=600, cwd=ROOT)  # from the repository root, as the config says
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    rollout = next(x["rollout"] for x in steps if "rollout" in x)
    assert rollout["failed"] == 0 and rollout["traces"] == 6 and rollout["agents"]["solver"]["calls"] == 6


def test_an_environment_that_raises_fails_its_own_episodes_alone_with_its_message(tmp_path):
    data = _config(tmp_path, "vf_flaky", {"agent": "solver"})
    data["rollout"]["max_failed_fraction"] = 1.0
    tr, _, _ = prepared_trainer(data, tmp_path)
    rec = step_and_close(tr)
    # training tasks are idx 0 and 1; idx 1's grader raises: its samples fail, idx 0's are scored 1.0
    assert rec["rollout"]["failed"] == 3, rec["rollout"]
    assert "the grader of this task is broken" in rec["rollout"]["first_error"]
    assert all("Say 0." in t.calls[0].messages[-1]["content"] and t.calls[0].credit == 1.0
               for t in tr.last_traces if not t.error)
