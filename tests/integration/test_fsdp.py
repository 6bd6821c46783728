"""policies.X.fsdp: two ranks (two real processes over gloo on 127.0.0.1) shard one policy's weights,
gradients and AdamW state with torch's FSDP2, and take the same steps as the same two ranks
unsharded (data_parallel, itself equal to one process: test_data_parallel.py); a checkpoint
written by the sharded ranks resumes to the same weights, and its exported full weights load in a
plain worker."""

import copy
import socket

import pytest
import torch
import torch.multiprocessing as mp

from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
from masrl.messages import GenCall
from masrl.policies import PolicySpec

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def _algo(ac: bool = False):
    # two mini-batches (two optimizer steps), micro-batches of 2, GRPO groups that span both ranks
    # (padded rows on both sides: a sharded pass never uses the shared-prefix layout); the variant
    # (ac) also recomputes activations and keeps a KL term to a (sharded) reference model
    return AlgorithmConfig(micro_batch_size=2, mini_batches=2, group_key=["task_id"], share_prefix=False,
                           activation_checkpointing=ac, kl_coef=0.5 if ac else 0.0)


def _worker(fsdp: bool, ac: bool = False, model: str = "tiny-random"):
    from masrl.worker.policy_worker import PolicyWorker

    spec = PolicySpec("p", model, optim=OptimConfig(lr=1e-2), fsdp=fsdp, data_parallel=2 if fsdp else 1)
    return PolicyWorker(model, [spec], _algo(ac), seed=0, threads=1)


def _samples(model: str = "tiny-random"):
    w = _worker(False, model=model)
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    calls = [GenCall(f"c{i}", "p", [{"role": "user", "content": f"What is {i} + {i * 7}?"}], sp,
                     key={"task_id": f"t{i % 3}", "agent": "a", "turn": 0}, seed=100 + i) for i in range(10)]
    w.generate(calls)
    w.commit_rewards({f"c{i}": float((i * 37) % 5) / 4 for i in range(10)})
    return [w.sampler.buffer[f"c{i}"] for i in range(10)]


def _full(w) -> dict[str, torch.Tensor]:
    """The full weights: the sharded worker's gathered engine copy, or the plain model's own."""
    model = w.sampler.copy.model if w.held.sharded is not None else w.held.model
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _rank(rank: int, world: int, port: int, parts, out: str, fsdp: bool, ac: bool, model: str) -> None:
    w = _worker(fsdp, ac, model)
    w.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)
    result = {"state0": _full(w)}
    w.sampler.buffer = {s.call_id: s for s in copy.deepcopy(parts[rank])}
    result["metrics"] = w.train_step()
    result["state"] = _full(w)
    if ac or model != "tiny-random":  # one update is what these variants check
        torch.save(result, f"{out}/rank{rank}.pt")
        return
    if fsdp:  # what a rank holds of the parameters and moments, against the whole
        p = w.held.policy_parameters("p")
        result["held"] = sum(x.to_local().numel() for x in p)
        result["whole"] = sum(x.numel() for x in p)
        result["moments"] = w.updater.optimizers["p"].moment_bytes()
    result["text"] = [r.text for r in w.generate([GenCall(  # sampled from the updated weights
        "g", "p", [{"role": "user", "content": "What is 2 + 2?"}], SamplingParams(max_new_tokens=8), seed=5)])]
    w.save(f"{out}/ckpt")
    torch.distributed.barrier()
    w2 = _worker(fsdp)
    w2.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)  # the process group is already there
    w2.load(f"{out}/ckpt")
    result["loaded"] = _full(w2)
    w2.sampler.buffer = {s.call_id: s for s in copy.deepcopy(parts[rank])}
    result["metrics2"] = w2.train_step()
    result["state2"] = _full(w2)
    torch.save(result, f"{out}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(out, parts, fsdp, ac=False, model="tiny-random"):
    out.mkdir(parents=True, exist_ok=True)
    mp.start_processes(_rank, args=(2, _free_port(), parts, str(out), fsdp, ac, model), nprocs=2, join=True,
                       start_method="spawn")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _gap(a, b):
    return max((a[k].float() - b[k].float()).abs().max().item() for k in b)


def test_fsdp_ranks_take_the_steps_of_unsharded_ranks_and_resume(tmp_path):
    samples = _samples()
    parts = [copy.deepcopy(samples[:7]), copy.deepcopy(samples[7:])]  # uneven: rank 1 runs zero-weight passes
    plain = _two_ranks(tmp_path / "plain", parts, fsdp=False)
    sharded = _two_ranks(tmp_path / "fsdp", parts, fsdp=True)
    start = _gap(sharded[0]["state0"], plain[0]["state0"])
    moved = _gap(plain[0]["state"], plain[0]["state0"])
    gap1, gap2 = _gap(sharded[0]["state"], plain[0]["state"]), _gap(sharded[0]["state2"], plain[0]["state2"])
    across = _gap(sharded[0]["state2"], sharded[1]["state2"])
    mp_, ms = plain[0]["metrics"]["p"], sharded[0]["metrics"]["p"]
    print(f"start gap {start:.1e}; the update moved weights by up to {moved:.2e}; fsdp vs unsharded after step 1 "
          f"{gap1:.2e}, after resume + step 2 {gap2:.2e}; fsdp rank 0 vs 1 {across:.2e}; loss {mp_['loss']:.6f} vs "
          f"{ms['loss']:.6f}; grad norm {mp_['grad_norm']:.6f} vs {ms['grad_norm']:.6f}; held {sharded[0]['held']} "
          f"+ {sharded[1]['held']} of {sharded[0]['whole']} parameters; moments {sharded[0]['moments']} + "
          f"{sharded[1]['moments']} bytes vs {mp_['optimizer_state_gb'] * 2**30:.0f}; "
          f"weight sync {ms['weight_sync_s'] * 1e3:.1f} ms, {ms['weight_sync_gb'] * 2**30:.0f} bytes")
    assert start == 0.0 and moved > 1e-3
    assert gap1 < 1e-5 and gap2 < 1e-5 and across == 0.0
    assert ms["loss"] == pytest.approx(mp_["loss"], abs=1e-6)
    assert ms["grad_norm"] == pytest.approx(mp_["grad_norm"], rel=1e-5)
    assert ms["optimizer_steps"] == mp_["optimizer_steps"] == 2
    assert sharded[0]["held"] + sharded[1]["held"] == sharded[0]["whole"]
    assert max(sharded[0]["held"], sharded[1]["held"]) < 0.6 * sharded[0]["whole"]  # half each, not a copy each
    whole_moments = mp_["optimizer_state_gb"] * 2**30
    # split, not copied (each rank also keeps every parameter's 4-byte step count)
    assert sharded[0]["moments"] + sharded[1]["moments"] == pytest.approx(whole_moments, rel=1e-5)
    assert _gap(sharded[0]["loaded"], sharded[0]["state"]) == 0.0  # the shards came back exactly
    assert sharded[0]["metrics2"]["p"]["loss"] == pytest.approx(plain[0]["metrics2"]["p"]["loss"], abs=1e-6)
    # each rank's engine samples from the gathered copy: what the unsharded ranks' engines sample
    assert sharded[0]["text"] == sharded[1]["text"] == plain[0]["text"]
    ckpt = tmp_path / "fsdp" / "ckpt" / "p"
    assert (ckpt / "fsdp" / ".metadata").is_file() and (ckpt / "model.safetensors").is_file()


def test_an_fsdp_checkpoints_full_weights_load_in_a_plain_worker(tmp_path):
    """The exported model.safetensors is what serve and eval --checkpoint read: a worker without
    sharding loads it to the sharded ranks' weights."""
    samples = _samples()
    parts = [copy.deepcopy(samples[:5]), copy.deepcopy(samples[5:])]
    sharded = _two_ranks(tmp_path / "fsdp", parts, fsdp=True)
    w = _worker(False)
    w.load(str(tmp_path / "fsdp" / "ckpt"), with_optimizer=False)
    gap = _gap(_full(w), sharded[0]["state"])
    print(f"plain worker vs fsdp rank 0 after loading the export: {gap:.2e}")
    assert gap == 0.0


def test_fsdp_with_activation_checkpointing_and_a_kl_reference_takes_the_same_step(tmp_path):
    """algorithm.activation_checkpointing recomputes each FSDP block in backward (gathering its
    shards again), and algorithm.kl_coef > 0 scores every call under the reference model, sharded
    like the policy (its passes padded to the same count on every rank): the update is the
    unsharded ranks' with the same settings."""
    samples = _samples()
    parts = [copy.deepcopy(samples[:7]), copy.deepcopy(samples[7:])]
    plain = _two_ranks(tmp_path / "plain", parts, fsdp=False, ac=True)
    sharded = _two_ranks(tmp_path / "fsdp", parts, fsdp=True, ac=True)
    gap, moved = _gap(sharded[0]["state"], plain[0]["state"]), _gap(plain[0]["state"], plain[0]["state0"])
    print(f"fsdp + activation checkpointing vs unsharded: {gap:.2e} (the update moved weights by {moved:.2e})")
    mp_, ms = plain[0]["metrics"]["p"], sharded[0]["metrics"]["p"]
    print(f"kl {mp_['kl']:.3e} vs {ms['kl']:.3e}")
    assert moved > 1e-3 and gap < 1e-5
    assert ms["grad_norm"] == pytest.approx(mp_["grad_norm"], rel=1e-5)
    assert ms["kl"] > 0 and ms["kl"] == pytest.approx(mp_["kl"], rel=1e-4)


def test_an_untied_qwen2_with_biases_shards_and_steps_like_unsharded(tmp_path):
    """Qwen2.5-7B's structure in small (q/k/v biases, an output head of its own, another tokenizer):
    the sharded ranks' update is the unsharded ranks'."""
    samples = _samples("tiny-random-qwen2")
    parts = [copy.deepcopy(samples[:4]), copy.deepcopy(samples[4:])]
    plain = _two_ranks(tmp_path / "plain", parts, fsdp=False, model="tiny-random-qwen2")
    sharded = _two_ranks(tmp_path / "fsdp", parts, fsdp=True, model="tiny-random-qwen2")
    # a key bias has no gradient but rounding (softmax ignores what it adds to every key), and AdamW's
    # first step scales each gradient by its own size: that noise is not compared
    kept = [k for k in plain[0]["state"] if not k.endswith("k_proj.bias")]
    a, b, b0 = ({k: r[key][k] for k in kept} for r, key in ((sharded[0], "state"), (plain[0], "state"),
                                                             (plain[0], "state0")))
    gap, moved = _gap(a, b), _gap(b, b0)
    print(f"qwen2 fsdp vs unsharded: {gap:.2e} (the update moved weights by {moved:.2e}), {len(kept)} tensors")
    assert "lm_head.weight" in plain[0]["state"] and any(k.endswith("q_proj.bias") for k in plain[0]["state"])
    assert moved > 1e-3 and gap < 1e-5


def _load_plain_rank(rank: int, world: int, port: int, ckpt: str, out: str) -> None:
    w = _worker(True)
    w.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)
    w.load(ckpt, with_optimizer=False)  # no shards there: the full weights are split over the ranks
    torch.save({"state": _full(w), "held": sum(p.to_local().numel() for p in w.held.policy_parameters("p"))},
               f"{out}/loaded{rank}.pt")


def test_sharded_ranks_start_from_an_unsharded_checkpoint(tmp_path):
    """A checkpoint without shards (an unsharded run's) loads into fsdp ranks: each keeps its half,
    and the gathered weights are the checkpoint's."""
    plain = _worker(False)
    plain.sampler.buffer = {s.call_id: s for s in _samples()}
    plain.train_step()
    plain.save(str(tmp_path / "ckpt"))
    want = _full(plain)
    mp.start_processes(_load_plain_rank, args=(2, _free_port(), str(tmp_path / "ckpt"), str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    got = [torch.load(tmp_path / f"loaded{r}.pt", weights_only=False) for r in range(2)]
    assert _gap(got[0]["state"], want) == 0.0 and _gap(got[1]["state"], want) == 0.0
    assert got[0]["held"] + got[1]["held"] == sum(v.numel() for k, v in want.items() if k != "lm_head.weight")
