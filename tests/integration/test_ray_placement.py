"""runtime.placement: ray on a local Ray cluster (127.0.0.1, started and stopped by the test): the
same config and seed train to the same losses and weights as placement: local, only plain data
crosses, and a killed actor stops the run by name."""

import asyncio

import pytest

pytest.importorskip("ray")

from tinycfg import prepared_trainer, run_async, tiny_config  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def _config(tmp_path, placement):
    data = tiny_config("math/team_two_policies", tmp_path / placement, steps=2, threads=1, seed=0)
    data["runtime"] = {"placement": placement, "address": "local"}
    return data


def _run(tmp_path, placement, steps=2):
    tr, workers, before = prepared_trainer(_config(tmp_path, placement), tmp_path / placement)
    try:
        recs, traffic = [], [asyncio.run(tr.evaluate()).get("transfer")]  # an evaluation's traffic is its own
        for _ in range(steps):
            recs.append(asyncio.run(tr.train_step()))
        after = {p: w.fingerprint(p) for p, w in workers.items()}
        asyncio.run(tr.rt.controller.aclose())
    finally:
        tr.rt.close()
    return recs, traffic, before, after


def test_two_policies_in_two_ray_actors_train_like_one_process(tmp_path):
    local, local_traffic, before_l, after_l = _run(tmp_path, "local")
    ray_recs, traffic, before_r, after_r = _run(tmp_path, "ray")
    losses = lambda recs: [(p, m["loss"], m["grad_norm"]) for r in recs for p, m in sorted(r["policies"].items())]  # noqa: E731
    print("local:", losses(local), "\nray:  ", losses(ray_recs))
    assert before_r == before_l
    assert losses(ray_recs) == losses(local)
    assert [r["rollout"]["reward"] for r in ray_recs] == [r["rollout"]["reward"] for r in local]
    assert after_r == after_l and after_r != before_r
    assert all("transfer" not in r for r in local) and local_traffic == [None]
    print("evaluation:", traffic[0])
    assert traffic[0]["round_trips"] >= 4 and traffic[0]["bytes_to_actors"] > 0
    b1, b2 = (r["transfer"]["bytes_to_actors"] for r in ray_recs)
    assert b1 < 1.3 * b2  # step 1 carries no evaluation traffic (it would add ~65%)
    for step, rec in enumerate(ray_recs, 1):
        t = rec["transfer"]
        print(f"step {step}: {t}")
        assert t["round_trips"] >= 10  # generate (2 actors), commit_rewards, park, train_step, advantages
        # texts, ids and metrics: no tensors, no token ids
        assert 0 < t["bytes_to_actors"] < 1_000_000 and 0 < t["bytes_from_actors"] < 1_000_000


def _external_ip():
    """This machine's address on its default route, or None (no packet is sent)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_the_local_cluster_listens_on_loopback_only_and_a_killed_actor_stops_the_run_by_name(tmp_path):
    import socket

    import ray

    from masrl.errors import WorkerLost

    tr, workers, _ = prepared_trainer(_config(tmp_path, "ray"), tmp_path / "ray")
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        gcs_host, gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
        assert gcs_host == "127.0.0.1"
        with socket.create_connection((gcs_host, int(gcs_port)), timeout=5):
            pass  # reachable here
        ext = _external_ip()
        if ext is not None:  # and not from the machine's other interface
            with pytest.raises(OSError):
                socket.create_connection((ext, int(gcs_port)), timeout=5).close()
        asyncio.run(tr.train_step())
        path = tr.save_checkpoint()
        ray.kill(workers["writer"].actor)
        with pytest.raises(WorkerLost, match="hosting policy writer"):
            asyncio.run(tr.train_step())
        assert (path / "state.json").is_file()
    finally:
        tr.rt.close()


def test_a_data_parallel_policy_on_two_ranks_trains_like_one_process(tmp_path):
    """policies.X.data_parallel: 2 under ray: two actors (gloo), calls split between them, the
    update's gradient summed, the optimizer state sharded; two steps end at the weights of one
    local process, and each step's checkpoint holds both ranks' optimizer shares."""
    out = {}
    for placement in ("local", "ray"):
        data = tiny_config("math/team_shared", tmp_path / placement, steps=2, threads=1, seed=0)
        data["runtime"] = {"placement": placement, "address": "local"}
        if placement == "ray":  # ZeRO-1 too: each rank steps its share, and both write the checkpoints
            data["policies"]["shared"].update(data_parallel=2, shard_optimizer=True)
        tr, workers, before = prepared_trainer(data, tmp_path / placement)
        try:
            recs = [asyncio.run(tr.train_step()) for _ in range(2)]
            saved = tr.save_checkpoint()
            after = workers["shared"].fingerprint("shared")
            ranks = [r.fingerprint("shared") for r in getattr(tr.rt.workers[0], "ranks", [])]
            asyncio.run(tr.rt.controller.aclose())
        finally:
            tr.rt.close()
        out[placement] = (recs, before, after, ranks)
    (lr, lb, la, _), (rr, rb, ra, ranks) = out["local"], out["ray"]
    print("rewards", [r["rollout"]["reward"] for r in lr], [r["rollout"]["reward"] for r in rr],
          "\nweights", la, ra, "ranks", ranks, "\nn_seqs", [r["policies"]["shared"]["n_seqs"] for r in rr])
    assert rb == lb and len(ranks) == 2 and ranks[0] == ranks[1]
    assert [r["rollout"]["reward"] for r in rr] == [r["rollout"]["reward"] for r in lr]
    assert [r["policies"]["shared"]["n_seqs"] for r in rr] == [r["policies"]["shared"]["n_seqs"] for r in lr]
    assert ra != rb and ra == pytest.approx(la, rel=1e-6)
    shares = sorted(p.name for p in (saved / "shared").glob("optimizer*.pt"))
    assert shares == ["optimizer.pt", "optimizer.rank1.pt"], (saved, shares)


def test_async_rollouts_with_two_policies_in_two_ray_actors(tmp_path):
    """rollout.mode async on Ray: one actor per policy, episodes run on through the updates (which run
    in both actors at once), whole groups train once each, and calls carry their versions."""

    data = _config(tmp_path, "ray")
    data["rollout"].update(mode="async", tasks_per_step=2, samples_per_task=2)
    tr, workers, before = prepared_trainer(data, tmp_path / "ray")
    try:
        recs, traces = run_async(tr, 3)
        after = {p: w.fingerprint(p) for p, w in workers.items()}
    finally:
        tr.rt.close()
    assert all(not w.overlaps_update for w in workers.values())  # an actor runs one call at a time
    assert sum(r["async"]["episodes_running_at_update"] for r in recs) > 0
    trained = sum(m["n_seqs"] for r in recs for m in r["policies"].values())
    assert trained == sum(len(t.calls) for t in traces)  # every finished call of both policies trained once
    assert max(c.policy_version for t in traces for c in t.calls) >= 1
    assert all(after[p] != before[p] for p in after)


def test_async_rollouts_with_a_data_parallel_policy_on_two_ranks(tmp_path):
    """rollout.mode async with policies.X.data_parallel 2: calls split over the ranks as they arrive,
    each update trains every finished call once (the ranks' counts summed) and the ranks stay equal."""

    data = tiny_config("math/team_shared", tmp_path, steps=3, threads=1, seed=0)
    data["runtime"] = {"placement": "ray", "address": "local"}
    data["policies"]["shared"]["data_parallel"] = 2
    data["rollout"].update(mode="async", tasks_per_step=2, samples_per_task=2)
    tr, workers, before = prepared_trainer(data, tmp_path)
    try:
        recs, traces = run_async(tr, 3)
        ranks = [r.fingerprint("shared") for r in tr.rt.workers[0].ranks]
    finally:
        tr.rt.close()
    assert sum(r["policies"]["shared"]["n_seqs"] for r in recs) == sum(len(t.calls) for t in traces)
    assert max(c.policy_version for t in traces for c in t.calls) >= 1
    assert ranks[0] == ranks[1] != before["shared"]
