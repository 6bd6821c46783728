"""Running reward moments are trained with and carried through a checkpoint and resume."""


def test_running_moments_train_and_survive_a_resume(tmp_path):
    import json

    from tinycfg import tiny_config  # noqa: E402

    from masrl.config import load_config
    from masrl.driver.run.loop import train

    data = tiny_config("math/team_two_policies", tmp_path, steps=2)
    data["algorithm"].update({"reward_norm": "running", "whiten_advantages": True})
    train(load_config(data=data))
    metas = list((tmp_path / "checkpoints" / "step_000002").glob("worker_*.json"))
    stats = json.loads(metas[0].read_text())["reward_stats"]
    # 2 steps x 2 tasks x 3 samples x (calls of this worker's policies) rewards seen so far, per policy
    assert set(stats) and all(v["count"] > 0 and v["count"] % 6 == 0 for v in stats.values())
    data["train"]["steps"] = 3
    train(load_config(data=data), resume=True)
    after = json.loads(list((tmp_path / "checkpoints" / "step_000003").glob("worker_*.json"))[0].read_text())
    for k, v in after["reward_stats"].items():
        assert v["count"] > stats[k]["count"]  # kept counting from the saved moments, not from zero
