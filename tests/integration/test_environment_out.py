"""masrl out: a run config's workflow on its tasks served as an OpenEnv environment (``TaskEnvironment``, ``masrl
environment CONFIG``), scored as the family scores it; driven in this process, over OpenEnv's HTTP server by
OpenEnv's own client, and by verifiers' own ``openenv`` taskset with masrl's agents as its player."""

import asyncio
import socket
import subprocess
import sys
import time

import pytest
from tinycfg import prepared_trainer, step_and_close, tiny_config

from masrl.errors import ConfigError

pytest.importorskip("openenv.core.env_server.interfaces")
from masrl.driver.serving.environment import TaskAction, TaskEnvironment  # noqa: E402
from masrl.workflows.verifiers import verifiers_python  # noqa: E402

TINY = ["model=tiny-random"]


def test_a_family_plays_as_an_environment_and_pays_its_own_score():
    env = TaskEnvironment("math/solver", overrides=TINY)
    for seed in range(3):
        task = env.tasks[seed]
        obs = env.reset(seed=seed)
        assert not obs.done and obs.agent == "solver" and obs.messages[-1]["content"] == task.question
        right = env.step(TaskAction(message=f"<solution>...</solution><answer>{task.answer}</answer>"))
        assert right.done and right.reward == 1.0
        env.reset(seed=seed)
        wrong = env.step(TaskAction(message=f"<answer>{int(task.answer) + 1}</answer>"))
        assert wrong.done and wrong.reward == 0.0


def test_a_team_is_a_multi_turn_environment_with_every_agent_in_turn():
    env = TaskEnvironment("math/team_shared", overrides=TINY)
    task = env.tasks[0]
    obs, agents = env.reset(seed=0), []
    while not obs.done:
        agents.append(obs.agent)
        obs = env.step(TaskAction(message=f"<answer>{task.answer}</answer>"))
    assert agents[0] == "solver" and len(agents) >= 2 and len(set(agents)) >= 2
    assert set(obs.metadata["metrics"]) >= {"outcome"} and obs.reward == obs.metadata["metrics"]["outcome"]


def test_the_reasoning_gym_suite_is_scored_by_the_library():
    env = TaskEnvironment("reasoning_gym/solver", overrides=TINY)
    task = env.tasks[1]
    obs = env.reset(seed=1)
    assert task.question in obs.messages[-1]["content"]
    assert env.step(TaskAction(message=f"<answer>{task.answer}</answer>")).reward == 1.0


def test_a_bad_config_is_refused_naming_it():
    with pytest.raises(ConfigError, match="no shipped config of that name"):
        TaskEnvironment("no/such_config")
    with pytest.raises(ConfigError, match="split"):
        TaskEnvironment("math/solver", split="test", overrides=TINY)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "environment", "math/solver", *TINY, "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            assert time.monotonic() < deadline, "masrl environment did not start"
            time.sleep(0.3)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def test_openenvs_own_client_plays_a_served_family(served):
    from openenv.core.generic_client import GenericEnvClient

    async def play():
        async with GenericEnvClient(base_url=served) as client:
            first = await client.reset(seed=4)
            end = await client.step({"message": "<answer>-12345</answer>"})
            return first, end

    first, end = asyncio.run(play())
    assert not first.done and "<answer>" in first.observation["prompt"]
    assert end.done and end.reward == 0.0


@pytest.mark.skipif(subprocess.run([verifiers_python(), "-c", "import verifiers.v1.tasksets.openenv, openenv"],
                                   capture_output=True).returncode != 0, reason="verifiers (make verifiers)")
def test_verifiers_own_openenv_taskset_drives_a_served_family_with_masrls_agents(served, tmp_path):
    """The whole circle: masrl's math family behind OpenEnv's server, verifiers' own OpenEnv taskset stepping it,
    masrl's workflow ``verifiers`` playing verifiers' ``player`` seat through the gateway and training on it."""
    env = {"taskset": {"id": "openenv", "base_url": served, "resets": [{"seed": i} for i in range(4)]}}
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["agents"] = {"solver": {"policy": next(iter(data["policies"])), "max_new_tokens": 6}}
    data["workflow"] = {"name": "verifiers", "options": {"env": env, "seats": {"player": "solver"}}}
    data["data"] = {"train": {"source": "verifiers", "n": 2, "options": {"env": env, "idx": "0:2"}},
                    "eval": {"source": "verifiers", "n": 2, "options": {"env": env, "idx": "2:4"}}}
    data["rewards"] = [{"type": "credit", "weight": 1.0}]
    data["rollout"]["max_failed_fraction"] = 0.0
    tr, _, _ = prepared_trainer(data, tmp_path)
    rec = step_and_close(tr)
    assert rec["rollout"]["failed"] == 0, rec["rollout"].get("first_error")
    for t in tr.last_traces:
        assert t.calls and all(c.agent == "solver" for c in t.calls)
        # the player saw masrl's math problem, as the served environment wrote it
        assert "<answer>" in t.calls[0].messages[-1]["content"]
        assert set(t.state["rewards"]) == {"player.openenv_reward"}
        assert t.state["rewards"]["player.openenv_reward"] in (0.0, 1.0)
