"""Joining a cluster made with ``ray start --head`` (on 127.0.0.1, started and stopped by the
test), as the launch guide (docs/ray.md) does on real nodes: ``masrl train`` with
``runtime.address: HOST:PORT`` and with ``auto`` (``RAY_ADDRESS``) places its actors on that
cluster, trains, and leaves the cluster running; and on a three-node cluster (Ray's multi-node
test cluster, three raylets on 127.0.0.1) policies and data-parallel ranks spread one per node.
Each run is a subprocess of its own, so no Ray state is shared with the other tests here."""

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml

pytest.importorskip("ray")

from tinycfg import tiny_config  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

RAY = [sys.executable, "-c", "import sys; from ray.scripts.scripts import main; sys.exit(main())"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(tmp_path, name: str, address: str, env: dict) -> subprocess.CompletedProcess:
    data = tiny_config("math/team_two_policies", tmp_path / name, steps=1, threads=1, seed=0)
    data["runtime"] = {"placement": "ray", "address": address}
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_train_joins_a_cluster_started_with_ray_start(tmp_path):
    port = _free_port()
    # token authentication off on both sides, as docs/ray.md says for a trusted network
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # helpers: the tiny config's rewards
    # and Ray's single-machine mode, so that the head listens on 127.0.0.1 only (docs/ray.md)
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
            assert "node 127.0.0.1 (" in out  # the actors ran on the head's node
            rows = (tmp_path / name.replace(" ", "_") / "metrics.jsonl").read_text().splitlines()
            rec = next(r for r in map(json.loads, rows) if "transfer" in r)  # the step's record
            assert rec["step"] == 1 and rec["transfer"]["round_trips"] >= 10
        status = subprocess.run(RAY + ["status", f"--address={address}"], env=env, capture_output=True, text=True,
                                timeout=60, check=False)
        assert status.returncode == 0, status.stderr[-2000:]  # the runs left the cluster up
    finally:
        subprocess.run(RAY + ["stop", "--force"], env=env, capture_output=True, timeout=120, check=False)


CLUSTER = """
import sys
from ray.cluster_utils import Cluster

c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
for _ in range(2):
    c.add_node(num_cpus=1, num_gpus=0)
c.wait_for_nodes()
print(c.address, flush=True)
sys.stdin.readline()  # until the test says stop
c.shutdown()
"""


def _spread_run(tmp_path, name, config, address, env, **policy):
    data = tiny_config(config, tmp_path / name, steps=1, threads=1, seed=0)
    data["runtime"] = {"placement": "ray", "address": address, "strategy": "STRICT_SPREAD"}
    for p in data["policies"].values():
        p.update(policy)
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(data))
    p = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], env=env, capture_output=True,
                       text=True, timeout=300, check=False)
    out = p.stdout + p.stderr
    print("\n".join(line for line in out.splitlines() if "[masrl]" in line))
    assert p.returncode == 0, out[-4000:]
    actors = [line for line in out.splitlines() if line.startswith("[masrl] masrl-worker")]
    rows = [json.loads(r) for r in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return out, actors, next(r for r in rows if "transfer" in r)


def test_policies_and_ranks_spread_over_three_nodes(tmp_path):
    """The three-policy launch of docs/ray.md on a cluster of three nodes (Ray's own multi-node test
    cluster: three raylets on 127.0.0.1, one CPU each): with runtime.strategy STRICT_SPREAD every
    policy's actor lands on a node of its own, and the team trains; so do the two ranks of a
    data-parallel policy, which meet at rank 0's node."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)
    cluster = subprocess.Popen([sys.executable, "-c", CLUSTER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    try:
        address = cluster.stdout.readline().strip()
        assert address, "the test cluster did not start"
        node_of = lambda line: line.split("(")[1].split(")")[0]  # noqa: E731
        out, actors, step = _spread_run(tmp_path, "team3", "math/team_three_policies", address, env)
        assert "3 node(s)" in out and len(actors) == 3
        assert len({node_of(a) for a in actors}) == 3, actors  # one node each
        assert set(step["policies"]) == {"solver", "verifier", "writer"}
        out, actors, step = _spread_run(tmp_path, "dp2", "math/team_shared", address, env, data_parallel=2)
        assert len(actors) == 2 and len({node_of(a) for a in actors}) == 2, actors
        assert step["policies"]["shared"]["optimizer_steps"] >= 1
    finally:
        try:
            cluster.communicate("stop\n", timeout=120)
        except subprocess.TimeoutExpired:
            cluster.kill()
