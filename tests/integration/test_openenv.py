"""OpenEnv environments as a workflow (``workflow: openenv``): one written against OpenEnv's own base classes, run
in this process and served by OpenEnv's own HTTP server on 127.0.0.1, with masrl's agents as the actor."""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tinycfg import prepared_trainer, tiny_config

from masrl.errors import ConfigError
from masrl.workflows.openenv import OpenEnvWorkflow

pytest.importorskip("openenv.core.env_server.interfaces")

TESTS = Path(__file__).resolve().parents[1]


def _config(tmp_path, **options):
    data = tiny_config("math/solver", tmp_path, steps=1)
    data["agents"] = {"actor": {"policy": next(iter(data["policies"])), "max_new_tokens": 4}}
    data["workflow"] = {"name": "openenv", "options": options}
    data["data"] = {"train": {"source": "episodes", "n": 20, "seed": 1}, "eval": {"source": "episodes", "n": 4,
                                                                                  "seed": 2}}
    data["rewards"] = [{"type": "credit", "weight": 1.0}]
    data["rollout"]["max_failed_fraction"] = 0.0
    return data


def _episodes(tr):
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == 0, rec["rollout"].get("first_error")
    return tr.last_traces


def _check_rewards_to_go(traces):
    for t in traces:
        rewards = t.state["rewards"]
        assert 1 <= len(t.calls) == len(rewards) == t.state["turns"] <= 3
        assert all(r in (-0.1, 1.0) for r in rewards)
        for i, c in enumerate(t.calls):  # each call paid the rewards from its step to the end
            assert c.credit == pytest.approx(sum(rewards[i:]))
        assert t.state["done"] is True


def test_an_environment_in_this_process_plays_its_episodes(tmp_path):
    tr, _, _ = prepared_trainer(_config(tmp_path, env="openenv_envs:GuessEnv"), tmp_path)
    traces = _episodes(tr)
    _check_rewards_to_go(traces)
    first = traces[0].calls[0].messages
    assert first[-1] == {"role": "user", "content": "Guess my digit, 0 to 9. Reply with the digit."}
    if len(traces[0].calls) > 1:  # the conversation so far: its reply, then the environment's answer
        assert traces[0].calls[1].messages[-2]["role"] == "assistant"
        assert traces[0].calls[1].messages[-1]["content"].startswith("Wrong:")
    asyncio.run(tr.rt.controller.aclose())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_openenv_server_plays_the_same_episodes_over_its_own_client(tmp_path):
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "openenv_envs", str(port)], cwd=TESTS,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None, server.stdout.read().decode()[-2000:]
                assert time.monotonic() < deadline, "the OpenEnv server did not start"
                time.sleep(0.2)
        tr, _, _ = prepared_trainer(_config(tmp_path, url=f"http://127.0.0.1:{port}", action_field="guess",
                                            max_sessions=4), tmp_path)
        _check_rewards_to_go(_episodes(tr))
        asyncio.run(tr.rt.controller.aclose())
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("options, needle", [
    ({}, "give exactly one of env"),
    ({"env": "openenv_envs:GuessAction"}, "is not an openenv Environment subclass"),
    ({"env": "openenv_envs:GuessEnv", "action_field": "guesss"}, "'guesss' is not a field of GuessAction"),
    ({"url": "http://127.0.0.1:9"}, "name the action's field"),
    ({"env": "openenv_envs:GuessEnv", "env_options": {"max_step": 2}}, "GuessEnv(**env_options) failed"),
    ({"env": "openenv_envs:GuessEnv", "agents": ["a", "b"]}, "actor_field"),
])
def test_a_bad_option_is_a_config_error_naming_the_fix(options, needle):
    with pytest.raises(ConfigError) as e:
        OpenEnvWorkflow(**options)
    assert needle in str(e.value)


def test_a_masrl_game_served_as_an_openenv_environment_plays_by_its_rules():
    """masrl out: OpenSpiel's tic_tac_toe behind OpenEnv's interface, the client in seat 0 against perfect play:
    a random client never wins, the opponent answers inside step, a refused move is asked again once."""
    import random

    from masrl.families.games.openenv_env import GameAction, GameEnvironment

    env = GameEnvironment(game="tic_tac_toe", library="openspiel", opponent="minimax")
    results = []
    for seed in range(12):
        obs, rng = env.reset(seed=seed), random.Random(seed)
        assert obs.prompt.endswith("Available moves: " + ", ".join(obs.legal_moves))
        while not obs.done:
            obs = env.step(GameAction(message=rng.choice(obs.legal_moves)))
            assert obs.reward == 0.0 or obs.done
        results.append(obs.reward)
    assert set(results) <= {0.0, -1.0} and -1.0 in results
    obs = env.reset(seed=0)
    obs = env.step(GameAction(message="[nine]"))
    assert obs.invalid and not obs.done
    obs = env.step(GameAction(message="[nine]"))
    assert obs.done and obs.reward == -1.0
    with pytest.raises(ConfigError, match="cannot play"):
        GameEnvironment(game="kuhn_poker", library="openspiel", opponent="minimax")


def test_masrl_trains_on_its_own_game_through_the_openenv_workflow(tmp_path):
    """The round trip: a masrl game served as an OpenEnv environment, trained by the openenv workflow."""
    options = {"env": "masrl.families.games.openenv_env:GameEnvironment", "observation_field": "prompt",
               "env_options": {"game": "kuhn_poker", "library": "openspiel"}}
    tr, _, _ = prepared_trainer(_config(tmp_path, **options), tmp_path)
    traces = _episodes(tr)
    for t in traces:
        assert t.calls and t.state["done"] is True
        assert t.calls[0].messages[-1]["content"].startswith("Kuhn Poker")
        assert t.calls[-1].credit == pytest.approx(t.state["rewards"][-1])
    asyncio.run(tr.rt.controller.aclose())


def test_the_shipped_openenv_example_trains_a_step_through_the_cli(tmp_path):
    """examples/openenv_guess.yaml, as its header says to run it (PYTHONPATH=examples, from the repository root)."""
    import json

    import yaml

    root = TESTS.parent
    data = tiny_config("examples/openenv_guess.yaml", tmp_path / "run", steps=1)
    data["rewards"] = [r for r in data["rewards"] if not r["type"].startswith("helpers:")]  # a test-only module
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], capture_output=True, text=True,
                         timeout=600, cwd=root, env={**os.environ, "PYTHONPATH": "examples"})
    assert out.returncode == 0, out.stderr[-3000:]
    rollout = next(json.loads(x)["rollout"] for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
                   if "rollout" in json.loads(x))
    assert rollout["failed"] == 0 and rollout["traces"] == 6
    # every episode is the environment's own: up to 4 guesses, its reward the environment's (-0.1 a miss, 1 a hit)
    assert -0.4 - 1e-9 <= rollout["outcome"] <= 1.0
