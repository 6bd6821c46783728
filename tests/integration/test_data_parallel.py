"""A data-parallel policy: two ranks over gloo (two real processes, 127.0.0.1), each with half of
the calls, take the same optimizer steps as one process with all of them; with
``shard_optimizer`` (ZeRO-1) each rank holds half of the AdamW state, and a checkpoint written by
the two ranks resumes to the same weights."""

import copy
import socket

import pytest
import torch
import torch.multiprocessing as mp

from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
from masrl.messages import GenCall
from masrl.policies import PolicySpec

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def _algo():
    # two mini-batches (two optimizer steps), micro-batches of 2, GRPO groups that span both ranks
    return AlgorithmConfig(micro_batch_size=2, mini_batches=2, group_key=["task_id"])


def _worker(shard: bool = False):
    from masrl.worker.policy_worker import PolicyWorker

    spec = PolicySpec("p", "tiny-random", optim=OptimConfig(lr=1e-2), shard_optimizer=shard)
    return PolicyWorker("tiny-random", [spec], _algo(), seed=0, threads=1)


def _samples():
    w = _worker()
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    calls = [GenCall(f"c{i}", "p", [{"role": "user", "content": f"What is {i} + {i * 7}?"}], sp,
                     key={"task_id": f"t{i % 3}", "agent": "a", "turn": 0}, seed=100 + i) for i in range(10)]
    w.generate(calls)
    w.commit_rewards({f"c{i}": float((i * 37) % 5) / 4 for i in range(10)})
    return w, [w.sampler.buffer[f"c{i}"] for i in range(10)]


def _state(w):
    return {k: v.clone() for k, v in w.held.model.state_dict().items()}


def _rank(rank: int, world: int, port: int, parts, out: str, shard: bool) -> None:
    w = _worker(shard)
    w.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)
    w.sampler.buffer = {s.call_id: s for s in copy.deepcopy(parts[rank])}
    m = w.train_step()
    result = {"state": _state(w), "metrics": m}
    if shard:  # both ranks write a checkpoint, fresh workers load it and take a second step
        w.save(f"{out}/ckpt")
        torch.distributed.barrier()
        w2 = _worker(shard)
        w2.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)  # the process group is already there
        w2.load(f"{out}/ckpt")
        w2.sampler.buffer = {s.call_id: s for s in copy.deepcopy(parts[rank])}
        result["metrics2"] = w2.train_step()
        result["state2"] = _state(w2)
    torch.save(result, f"{out}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_ranks(tmp_path, parts, shard):
    mp.start_processes(_rank, args=(2, _free_port(), parts, str(tmp_path), shard), nprocs=2, join=True,
                       start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _gap(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in b)


def test_two_gloo_ranks_take_the_steps_of_one_process(tmp_path):
    ref, samples = _samples()
    parts = [copy.deepcopy(samples[:6]), copy.deepcopy(samples[6:])]  # uneven on purpose
    before = _state(ref)
    m_ref = ref.train_step()
    after = ref.held.model.state_dict()
    ranks = _two_ranks(tmp_path, parts, shard=False)
    gap, moved = _gap(ranks[0]["state"], after), _gap(after, before)
    across = _gap(ranks[0]["state"], ranks[1]["state"])
    print(f"one process vs rank 0: max |dw| {gap:.2e} (the update itself moved weights by up to {moved:.2e}); "
          f"rank 0 vs rank 1: {across:.2e}; optimizer steps {m_ref['p']['optimizer_steps']} vs "
          f"{[r['metrics']['p']['optimizer_steps'] for r in ranks]}; loss {m_ref['p']['loss']:.6f} vs "
          f"{ranks[0]['metrics']['p']['loss']:.6f}")
    assert moved > 1e-3
    assert across == 0.0  # every rank applies the same summed gradient
    assert gap < 1e-5
    assert ranks[0]["metrics"]["p"]["optimizer_steps"] == m_ref["p"]["optimizer_steps"] == 2
    assert ranks[0]["metrics"]["p"]["loss"] == pytest.approx(m_ref["p"]["loss"], abs=1e-6)


def test_sharded_optimizer_holds_half_the_state_steps_like_one_process_and_resumes(tmp_path):
    ref, samples = _samples()
    parts = [copy.deepcopy(samples[:6]), copy.deepcopy(samples[6:])]
    pristine = copy.deepcopy(samples)
    m1 = ref.train_step()
    after1 = _state(ref)
    ref.sampler.buffer = {s.call_id: s for s in pristine}  # the same calls again, as the resumed ranks get them
    m2 = ref.train_step()
    after2 = _state(ref)
    ranks = _two_ranks(tmp_path, parts, shard=True)
    held = [r["metrics"]["p"]["optimizer_state_gb"] * 2**30 for r in ranks]
    whole = m1["p"]["optimizer_state_gb"] * 2**30
    gap1, gap2 = _gap(ranks[0]["state"], after1), _gap(ranks[0]["state2"], after2)
    across = _gap(ranks[0]["state2"], ranks[1]["state2"])
    print(f"AdamW state: one process {whole:.0f} bytes, ranks {held}; step 1 gap {gap1:.2e}, after resume step 2 "
          f"gap {gap2:.2e}, rank 0 vs 1 {across:.2e}; loss {m2['p']['loss']:.6f} vs "
          f"{ranks[0]['metrics2']['p']['loss']:.6f}")
    # split, not copied: ZeRO gives each parameter to one rank (largest first, to the lightest rank), so a
    # share exceeds half by at most the largest parameter's moments (tiny-random: the embedding is most of it)
    biggest = 8 * max(p.numel() for p in ref.updater.optimizers["p"].masters)
    assert sum(held) == pytest.approx(whole, rel=1e-9) and min(held) > 0
    assert max(held) <= whole / 2 + biggest + 1024
    assert gap1 < 1e-5 and gap2 < 1e-5 and across == 0.0
    assert (tmp_path / "ckpt" / "p" / "optimizer.pt").is_file() and (tmp_path / "ckpt" / "p" / "optimizer.rank1.pt").is_file()
    assert ranks[0]["metrics2"]["p"]["loss"] == pytest.approx(m2["p"]["loss"], abs=1e-6)


def _bf16_rank(rank: int, world: int, port: int, parts, out: str) -> None:
    from masrl.worker.policy_worker import PolicyWorker

    spec = PolicySpec("p", "tiny-random", optim=OptimConfig(lr=1e-2), shard_optimizer=True)
    make = lambda: PolicyWorker("tiny-random", [spec], _algo(), seed=0, threads=1, precision="bf16")  # noqa: E731
    w = make()
    w.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)
    w.sampler.buffer = {s.call_id: s for s in copy.deepcopy(parts[rank])}
    w.train_step()
    w.save(f"{out}/ckpt")
    torch.distributed.barrier()
    w2 = make()
    w2.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)
    w2.load(f"{out}/ckpt")
    opt1, opt2 = w.updater.optimizers["p"], w2.updater.optimizers["p"]
    low = [i for i, p in enumerate(opt1.params) if p.dtype == torch.bfloat16]  # those with fp32 masters
    gap = max((opt1.masters[i] - opt2.masters[i]).abs().max().item() for i in low) if low else -1.0
    # what the masters would be if rebuilt from the bf16 weights instead
    rounding = max((opt1.masters[i] - opt1.params[i].float()).abs().max().item() for i in low) if low else 0.0
    torch.save({"gap": gap, "rounding": rounding, "n_low": len(low)}, f"{out}/bf16_rank{rank}.pt")


def test_a_resumed_sharded_rank_gets_the_fp32_masters_not_the_bf16_weights(tmp_path):
    """bf16 weights with fp32 masters: a rank's own optimizer file holds only its share of the
    moments; its masters come back from rank 0's file, exactly, not rounded through bf16."""
    _, samples = _samples()
    parts = [copy.deepcopy(samples[:6]), copy.deepcopy(samples[6:])]
    mp.start_processes(_bf16_rank, args=(2, _free_port(), parts, str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    res = [torch.load(tmp_path / f"bf16_rank{r}.pt") for r in range(2)]
    print(f"masters after resume vs before: {[r['gap'] for r in res]}; bf16 rounding they would carry: "
          f"{[r['rounding'] for r in res]} over {res[0]['n_low']} bf16 parameters")
    assert all(r["n_low"] > 0 and r["rounding"] > 0 for r in res)  # the update left sub-bf16 bits in the masters
    assert all(r["gap"] == 0.0 for r in res)
