"""A rollout engine that did not take a publish fails the step loudly instead of sampling the old policy under the
new version's name (LoRA + async kept sampling the old policy silently in verl, issue 7495, and ms-swift, 9855)."""

from __future__ import annotations

import pytest
from tinycfg import prepared_trainer, step_and_close, tiny_config

from masrl.engines.paged import PagedEngine


@pytest.mark.parametrize("lora", [False, True])
def test_a_publish_the_paged_engine_did_not_take_fails_the_step(tmp_path, monkeypatch, lora):
    data = tiny_config("math/solver", tmp_path / "run", steps=1)
    data["rollout"].update(engine="paged", gpu_memory_utilization=0.001)
    data["algorithm"]["skip_zero_advantage"] = False  # every sequence trains: the step changes the weights
    if lora:
        data["policies"][next(iter(data["policies"]))]["lora"] = {"r": 4, "alpha": 8}
    tr, workers, _ = prepared_trainer(data, tmp_path / "run")
    rec = step_and_close(tr)  # as shipped: the engine takes every publish
    assert rec["step"] == 1 and all(w.sampler.engine.stale_weights() == [] for w in workers.values())

    tr, workers, _ = prepared_trainer(data, tmp_path / "run2")
    monkeypatch.setattr(PagedEngine, "weights_updated", lambda self, policies=None: None)  # a publish it never takes
    with pytest.raises(RuntimeError, match="the rollout engine did not take the new weights of .*still the old: layer"):
        step_and_close(tr)
