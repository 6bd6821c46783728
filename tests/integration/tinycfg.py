"""Small configs on the tiny random model for integration tests."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from masrl.families import config_path

ROOT = Path(__file__).resolve().parents[2]
TEAM = ["solver", "verifier", "refiner", "finalizer"]


def _tiny_data(data: dict) -> dict:
    """A config's ``data`` section shrunk: 40 training and 3 held-out tasks of the kind its workflow needs."""
    source = data.get("train", {}).get("source", "arithmetic")
    if source == "code_gen":  # code workflows keep code tasks and their own (credit) rewards
        return {"train": {"source": "code_gen", "n": 40, "seed": 1, "levels": [1, 2]},
                "eval": {"source": "code_gen", "n": 3, "seed": 2, "levels": [1, 2]}}
    if source == "code_docs":  # code from documentation: 8 entries a task keep tiny prompts short
        return {"world": {"context_docs": 8}, "train": {"source": "code_docs", "n": 40, "seed": 1, "levels": [1, 2]},
                "eval": {"source": "code_docs", "n": 3, "seed": 2, "levels": [1, 2]}}
    if source == "math_chain":  # chained problems: the stepping workflows need their events in meta
        return {"train": {"source": "math_chain", "n": 40, "seed": 1, "levels": [2, 3]},
                "eval": {"source": "math_chain", "n": 3, "seed": 2, "levels": [2, 3]}}
    if source == "episodes":  # environments: seeded episodes
        return {"train": {"source": "episodes", "n": 40, "seed": 1}, "eval": {"source": "episodes", "n": 3, "seed": 2}}
    if source == "qa_world":  # search workflows: questions about a small world, searched locally
        world = {"docs": 40, "seed": 0, "context_docs": data.get("world", {}).get("context_docs", 0)}
        levels = {"levels": data["train"]["levels"]} if "levels" in data["train"] else {}
        return {"world": world, "train": {"source": "qa_world", "n": 40, "seed": 1, **levels},  # (two-hop
                "eval": {"source": "qa_world", "n": 3, "seed": 2, **levels}}  # workflows need level 2)
    if source == "reasoning_gym":  # the library's datasets as the config mixes them, scored by the library
        opts = data["train"].get("options", {})
        return {"train": {"source": "reasoning_gym", "n": 40, "seed": 1, "options": opts},
                "eval": {"source": "reasoning_gym", "n": 3, "seed": 2, "options": opts}}
    if source == "verifiers":  # a verifiers taskset: its own tasks, a few of each split
        tr, ev = data["train"]["options"], data["eval"]["options"]
        return {"train": {"source": "verifiers", "n": 6, "seed": 1, "options": {**tr, "idx": "0:6"}},
                "eval": {"source": "verifiers", "n": 3, "seed": 2, "options": {**ev, "idx": "6:9"}}}
    return {"train": {"source": "arithmetic", "n": 40, "seed": 1}, "eval": {"source": "arithmetic", "n": 3, "seed": 2}}


def tiny_config(base: str | dict = "math/team_shared", run_dir: Path | None = None, *, steps: int = 2,
                hash_agents: list[str] | None = None, **overrides) -> dict:
    """A shipped config (by name) or a dict, shrunk to run in seconds on ``tiny-random``."""
    if isinstance(base, str):
        path = ROOT / base if (ROOT / base).is_file() else config_path(base)  # examples/x.yaml, or math/solver
        data = yaml.safe_load(path.read_text())
    else:
        data = copy.deepcopy(base)
    data["model"] = "tiny-random"
    for p in data["policies"].values():
        p.pop("model", None)
    for a in data["agents"].values():
        a["max_new_tokens"] = 6
    data["data"] = _tiny_data(data.get("data", {}))
    # the config's own rewards (credit, say) stay; the outcome reward always pays
    rewards = [{"type": "outcome"}] + [r for r in data.get("rewards", [{"type": "format", "weight": 0.5}])
                                       if r["type"] != "outcome"]
    # sizes shrink; what the config's rollout does (counterfactual credit, dynamic sampling) stays
    kept = {k: v for k, v in data.get("rollout", {}).items() if k in ("counterfactual", "dynamic_sampling")}
    data["rollout"] = {"tasks_per_step": 2, "samples_per_task": 3, "max_wait_ms": 5, **kept}
    data["rewards"] = rewards + [{"type": "helpers:agent_hash_reward", "options": {"agents": hash_agents}}]
    data["train"] = {"steps": steps, "save_every": 1, "eval_before": False, "eval_after": False, "log_traces": 2}
    data["algorithm"] = {"micro_batch_size": 4}
    if run_dir is not None:
        data["output_dir"] = str(run_dir)
    for k, v in overrides.items():
        node = data
        parts = k.split("__")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = v
    return data


def step_and_close(tr, before_close=None) -> dict:
    """One training step and the run's close on one event loop, as a run has them (a workflow that serves, its
    gateway or runner, is stopped on the loop that started it); ``before_close(tr)`` runs between the two."""
    import asyncio

    async def go():
        try:
            return await tr.train_step()
        finally:
            if before_close is not None:
                before_close(tr)
            await tr.rt.controller.aclose()

    return asyncio.run(go())


def prepared_trainer(data: dict, run_dir: Path):
    """A Trainer for ``data`` with its workers built, and each policy's weight fingerprint."""
    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    tr = Trainer(load_config(data=data), run_dir=run_dir)
    tr.prepare(resume=False)
    workers = {p: w for w in tr.rt.workers for p in w.policy_names}
    return tr, workers, {p: workers[p].fingerprint(p) for p in workers}


def run_async(tr, updates: int, check=None) -> tuple[list[dict], list]:
    """``updates`` updates of the asynchronous loop, then its running episodes stopped and the batchers
    closed; returns each update's record and the traces the updates trained. ``check(rollouts)``,
    when given, runs after every update."""
    import asyncio


    async def go():
        rollouts = tr.async_rollouts()
        recs, seen = [], []
        for _ in range(updates):
            recs.append(await tr.async_step(rollouts))
            seen += tr.last_traces
            if check is not None:
                check(rollouts)
        await rollouts.stop()
        await tr.rt.controller.aclose()
        return recs, seen

    return asyncio.run(go())


def start_serve(cfg_path, *extra: str, timeout_s: float = 120):
    """``masrl serve CFG --port 0 EXTRA`` as a subprocess (tests/ on its path, for configs' test
    rewards); returns the process, its base URL (``http://127.0.0.1:PORT``) and the lines it printed (a list that
    keeps growing: its output is read on a thread until it exits)."""
    import os
    import re
    import subprocess
    import sys
    import time

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "serve", str(cfg_path), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen, deadline = [], time.time() + timeout_s
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", line)
        if m:
            # keep reading what it prints (into ``seen``): a server whose log fills an unread pipe blocks on its next
            # line, which a test that sends many malformed requests (one log line each) would take for a hang
            import threading

            threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True).start()
            return proc, m.group(1), seen
    proc.kill()
    raise AssertionError("masrl serve did not come up:\n" + "".join(seen))
