"""rollout.overlap_update: the engine samples from its own copy of the trainable weights, so an
update runs while episodes generate; the new weights reach the engine only when published, and the
calls sampled from then on carry the new version. Real tiny-random models on this CPU."""


import pytest
import torch
from helpers import update_held_open
from tinycfg import prepared_trainer, run_async, tiny_config

from masrl.config import SamplingParams, load_config
from masrl.messages import GenCall

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def _data(base, run_dir, steps=3, **rollout):
    data = tiny_config(base, run_dir, steps=steps)
    data["rollout"].update(mode="async", overlap_update=True, **rollout)
    return data


def _call(policy: str, i: int) -> GenCall:
    return GenCall(f"c{i}", policy, [{"role": "user", "content": "What is 2 + 3?"}],
                   SamplingParams(temperature=1.0, max_new_tokens=8, stop=[]), seed=7,
                   key={"task_id": "t", "agent": "solver", "turn": 0})


def _sampled(w, policy: str, i: int):
    res = w.generate([_call(policy, i)])[0]
    s = w.sampler.buffer[f"c{i}"]
    return res.version, s.completion_ids, s.logprobs


def test_the_engine_samples_its_copy_until_the_update_is_published(tmp_path):
    tr, workers, _ = prepared_trainer(_data("math/team_shared", tmp_path), tmp_path)
    w = workers["shared"]
    assert w.overlaps_update and w.sampler.engine.model is not w.held.model
    v0, ids0, lp0 = _sampled(w, "shared", 0)
    with torch.no_grad():  # what an optimizer step does to the live weights
        for p in w.held.policy_parameters("shared"):
            p.add_(torch.randn_like(p) * 0.5)
    v1, ids1, lp1 = _sampled(w, "shared", 1)
    assert (v1, ids1, lp1) == (v0, ids0, lp0)  # the engine still reads the weights it had
    w.updater.updates["shared"] += 1
    w.sampler.publish(["shared"], w.updater.updates)
    v2, _, lp2 = _sampled(w, "shared", 2)
    assert v2 == 1 and lp2 != lp0  # from the publish on: the new weights, the new version
    live = dict(w.held.model.named_parameters())
    assert all(torch.equal(p, live[n]) for n, p in w.sampler.copy.model.named_parameters())
    tr.rt.close()


def test_a_lora_copy_shares_the_base_and_copies_only_the_adapters(tmp_path):
    tr, workers, _ = prepared_trainer(_data("math/team_lora", tmp_path), tmp_path)
    w = next(iter(workers.values()))
    live = dict(w.held.model.named_parameters())
    copied = {n for n, p in w.sampler.copy.model.named_parameters() if p.data_ptr() != live[n].data_ptr()}
    trainable = {n for n, p in live.items() if any(p is q for _, src in w.sampler.copy.pairs.values() for q in src)}
    assert copied and copied == trainable
    assert all("lora_" in n for n in copied)
    assert w.sampler.copy.copied_bytes() < sum(p.numel() * p.element_size() for p in live.values()) / 10
    tr.rt.close()


def test_generation_runs_while_the_update_does_and_keeps_its_version(tmp_path):
    """An engine batch started during an update is not held back by it and is tagged with the old
    version; the update trains only what it took and keeps the calls that arrived meanwhile."""
    tr, workers, _ = prepared_trainer(_data("math/team_shared", tmp_path), tmp_path)
    w = workers["shared"]
    for i in range(4):  # rewarded calls for one update
        _sampled(w, "shared", 100 + i)
        w.sampler.buffer[f"c{100 + i}"].reward = float(i % 2)
    with update_held_open(w) as seen:  # the update holds on until a generation has run inside it
        during = _sampled(w, "shared", 200)  # would deadlock if the engine waited for the update
    assert during[0] == 0 and seen["m"]["shared"]["n_seqs"] == 4
    assert set(w.sampler.buffer) == {"c200"} and _sampled(w, "shared", 201)[0] == 1
    tr.rt.close()


def test_an_async_run_with_overlap_trains_and_counts_calls_sampled_during_updates(tmp_path):
    data = _data("math/team_shared", tmp_path)
    # staleness 1 holds the third update's tasks back until the first update is published, so that
    # update trains calls of version 1 however fast the episodes run (unbounded, a fast machine could
    # finish all of them on version 0 during the first update, and the check below would be luck)
    data["policies"]["shared"]["max_staleness"] = 1
    tr, workers, before = prepared_trainer(data, tmp_path)
    w = workers["shared"]

    recs, traces = run_async(tr, 3)
    assert sum(r["async"]["calls_during_update"] for r in recs) > 0
    assert sum(r["policies"]["shared"]["n_seqs"] for r in recs) == sum(len(t.calls) for t in traces)
    assert max(c.policy_version for t in traces for c in t.calls) >= 1
    assert w.fingerprint("shared") != before["shared"] and not w.sampler.buffer
    tr.rt.close()


def test_overlap_update_is_refused_where_it_cannot_apply(tmp_path):
    data = tiny_config("math/team_shared", tmp_path)
    data["rollout"]["overlap_update"] = True
    with pytest.raises(Exception, match="overlap_update: true needs rollout.mode: async"):
        load_config(data=data)
    data["rollout"]["mode"] = "async"
    data["policies"]["shared"]["offload_weights"] = True
    with pytest.raises(Exception, match="policies.shared.offload_weights"):
        load_config(data=data)


def test_rollout_device_is_refused_where_it_cannot_apply_and_dropped_when_it_is_the_training_device(tmp_path):
    from masrl.driver.checks import check_policies

    data = tiny_config("math/team_shared", tmp_path)
    data["policies"]["shared"]["rollout_device"] = "cpu"
    assert check_policies(load_config(data=data))[0].rollout_device is None  # the device it trains on
    data["runtime"] = {"placement": "ray"}
    with pytest.raises(Exception, match="policies.shared.rollout_device: not with runtime.placement ray"):
        check_policies(load_config(data=data))


def test_on_the_paged_engine_an_update_reaches_running_calls_between_steps(tmp_path):
    """rollout.engine paged with overlap_update: batches take no lock, and a publish lands at the
    engine's next step boundary, running calls included, instead of waiting for the longest call;
    a call's version is the weights it started on. Then a whole async run trains on it."""
    import threading

    data = _data("math/team_shared", tmp_path, engine="paged", gpu_memory_utilization=0.01)
    tr, workers, before = prepared_trainer(data, tmp_path)
    w = workers["shared"]
    assert w.sampler.swaps_mid_call
    long = GenCall("long", "shared", [{"role": "user", "content": "Count to a thousand."}],
                   SamplingParams(temperature=1.0, max_new_tokens=600, stop=[]), seed=3,
                   key={"task_id": "t", "agent": "solver", "turn": 0})
    out = {}
    th = threading.Thread(target=lambda: out.update(r=w.generate([long])[0]))
    steps = w.sampler.engine.stats["decode_steps"]
    th.start()
    while w.sampler.engine.stats["decode_steps"] < steps + 8:  # it is decoding
        pass
    w.updater.updates["shared"] += 1  # what an update does before it publishes
    w.sampler.publish(["shared"], w.updater.updates)
    running = th.is_alive()
    th.join(60)
    print("publish returned while the call ran:", running, "; swaps mid-call", w.sampler.engine.stats["swaps_mid_call"],
          "; the call's version", out["r"].version, "tokens", out["r"].n_completion_tokens)
    assert running and w.sampler.engine.stats["swaps_mid_call"] == 1
    assert out["r"].version == 0 and w.sampler.published["shared"] == 1
    recs, traces = run_async(tr, 2)
    tr.rt.close()
    assert sum(r["policies"]["shared"]["n_seqs"] for r in recs) == sum(len(t.calls) for t in traces)
    assert w.fingerprint("shared") != before["shared"]
