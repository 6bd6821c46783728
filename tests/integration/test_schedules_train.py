"""Schedules in a tiny-random run: a policy updated every 2 steps trains on both steps' calls, the LR
follows warm-up and decay, and the EMA is what evaluation uses and what a resume restores."""

import json

import pytest
import torch
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import train


def test_update_every_lr_schedule_and_ema(tmp_path):
    data = tiny_config("math/team_two_policies", tmp_path, steps=4)
    pols = list(data["policies"])
    data["policies"][pols[0]]["schedule"] = {"update_every": 2}
    data["policies"][pols[1]]["schedule"] = {"warmup_updates": 2, "decay": "linear", "ema": 0.5}
    data["train"]["eval_after"] = True
    train(load_config(data=data))
    recs = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    slow = [r["policies"].get(pols[0]) for r in recs]
    assert slow[0] is None and slow[2] is None and slow[1] and slow[3]  # steps 2 and 4 only
    per_step = [sum(a["calls"] for n, a in r["rollout"]["agents"].items()
                    if data["agents"][n]["policy"] == pols[0]) for r in recs]
    assert slow[1]["n_seqs"] == per_step[0] + per_step[1]  # the waiting step's calls were trained on
    base = data["policies"][pols[1]].get("optim", {}).get("lr", 1e-5)
    lrs = [r["policies"][pols[1]]["lr"] for r in recs]
    # warm-up 1/2, 2/2, then linear decay toward 0 at update 4 (one past the last): 1, 1/2
    assert lrs == pytest.approx([base * 0.5, base, base, base * 0.5])
    ema = torch.load(tmp_path / "checkpoints" / "step_000004" / pols[1] / "ema.pt", weights_only=True)
    assert ema["decay"] == 0.5 and ema["shadow"]


def test_evaluation_serves_the_ema_weights_and_training_resumes_on_the_trained_ones(tmp_path):
    import asyncio

    from tinycfg import prepared_trainer

    data = tiny_config("math/team_shared", tmp_path, steps=1)
    data["policies"]["shared"]["schedule"] = {"ema": 0.9}
    data["policies"]["shared"]["optim"] = {"lr": 1e-2}
    tr, workers, before = prepared_trainer(data, tmp_path)
    asyncio.run(tr.train_step())
    w = workers["shared"]
    trained = w.fingerprint("shared")
    shadow_sum = float(sum(s.double().sum() for s in w.updater.emas["shared"].shadow))
    with w.evaluating():
        inside = w.fingerprint("shared")
    assert inside[0] == pytest.approx(shadow_sum, rel=1e-6) and inside != trained
    assert w.fingerprint("shared") == trained  # restored after the eval
    # the shadow moved a tenth of the way from the start to the trained weights
    assert shadow_sum == pytest.approx(0.9 * before["shared"][0] + 0.1 * trained[0], rel=1e-6)
