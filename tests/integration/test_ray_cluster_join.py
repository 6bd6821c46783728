"""Joining a cluster made with ``ray start --head`` (on 127.0.0.1, started and stopped by the
test), as the README's launch guide does on real nodes: ``masrl train`` with
``runtime.address: HOST:PORT`` and with ``auto`` (``RAY_ADDRESS``) places its actors on that
cluster, trains, and leaves the cluster running. Each run is a subprocess of its own, so no Ray
state is shared with the other tests in this process."""

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("ray")

from tinycfg import tiny_config  # noqa: E402

RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(tmp_path, name: str, address: str, env: dict) -> subprocess.CompletedProcess:
    data = tiny_config("math_team_two_policies", tmp_path / name, steps=1, threads=1, seed=0)
    data["runtime"] = {"placement": "ray", "address": address}
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_train_joins_a_cluster_started_with_ray_start(tmp_path):
    port = _free_port()
    # token authentication off on both sides, as the README says for a trusted network
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers: the tiny config's rewards
    # and Ray's single-machine mode, so that the head listens on 127.0.0.1 only (README)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.run(RAY + ["start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=4",
                                 "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats"],
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    try:
        assert head.returncode == 0, head.stdout[-2000:] + head.stderr[-3000:]
        address = f"127.0.0.1:{port}"
        runs = {"by address": _train(tmp_path, "by_address", address, env),
                "auto": _train(tmp_path, "auto", "auto", {**env, "RAY_ADDRESS": address})}
        for name, p in runs.items():
            out = p.stdout + p.stderr
            print(f"--- {name}: rc {p.returncode}\n" + "\n".join(line for line in out.splitlines() if "[masrl]" in line))
            assert p.returncode == 0, out[-4000:]
            assert "joined the Ray cluster" in out and "started a local Ray cluster" not in out
            assert "node 127.0.0.1," in out  # the actors ran on the head's node
            rows = (tmp_path / name.replace(" ", "_") / "metrics.jsonl").read_text().splitlines()
            rec = next(r for r in map(json.loads, rows) if "transfer" in r)  # the step's record
            assert rec["step"] == 1 and rec["transfer"]["round_trips"] >= 10
        status = subprocess.run(RAY + ["status", f"--address={address}"], env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert status.returncode == 0, status.stderr[-2000:]  # the runs left the cluster up
    finally:
        subprocess.run(RAY + ["stop", "--force"], env=env, capture_output=True, timeout=120, check=False)
