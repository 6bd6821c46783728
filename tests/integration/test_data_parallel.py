"""A data-parallel policy: two ranks over gloo (two real processes, 127.0.0.1), each with half of
the calls, take the same optimizer steps as one process with all of them."""

import copy
import socket

import pytest
import torch
import torch.multiprocessing as mp

from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
from masrl.messages import GenCall
from masrl.policies import PolicySpec


def _algo():
    # two mini-batches (two optimizer steps), micro-batches of 2, GRPO groups that span both ranks
    return AlgorithmConfig(micro_batch_size=2, mini_batches=2, group_key=["task_id"])


def _worker():
    from masrl.runtime.worker import PolicyWorker

    spec = PolicySpec("p", "tiny-random", optim=OptimConfig(lr=1e-2))
    return PolicyWorker("tiny-random", [spec], _algo(), seed=0, threads=1)


def _samples():
    w = _worker()
    sp = SamplingParams(temperature=1.0, max_new_tokens=6)
    calls = [GenCall(f"c{i}", "p", [{"role": "user", "content": f"What is {i} + {i * 7}?"}], sp,
                     key={"task_id": f"t{i % 3}", "agent": "a", "turn": 0}, seed=100 + i) for i in range(10)]
    w.generate(calls)
    w.commit_rewards({f"c{i}": float((i * 37) % 5) / 4 for i in range(10)})
    return w, [w.buffer[f"c{i}"] for i in range(10)]


def _rank(rank: int, world: int, port: int, parts, out: str) -> None:
    w = _worker()
    w.join_ranks(f"tcp://127.0.0.1:{port}", rank, world)
    w.buffer = {s.call_id: s for s in parts[rank]}
    m = w.train_step()
    torch.save({"state": {k: v.clone() for k, v in w.host.model.state_dict().items()}, "metrics": m}, f"{out}/rank{rank}.pt")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_take_the_steps_of_one_process(tmp_path):
    ref, samples = _samples()
    parts = [copy.deepcopy(samples[:6]), copy.deepcopy(samples[6:])]  # uneven on purpose
    before = {k: v.clone() for k, v in ref.host.model.state_dict().items()}
    m_ref = ref.train_step()
    after = ref.host.model.state_dict()
    mp.start_processes(_rank, args=(2, _free_port(), parts, str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    gap = max((ranks[0]["state"][k] - after[k]).abs().max().item() for k in after)
    moved = max((after[k] - before[k]).abs().max().item() for k in after)
    across = max((ranks[0]["state"][k] - ranks[1]["state"][k]).abs().max().item() for k in after)
    print(f"one process vs rank 0: max |dw| {gap:.2e} (the update itself moved weights by up to {moved:.2e}); "
          f"rank 0 vs rank 1: {across:.2e}; optimizer steps {m_ref['p']['optimizer_steps']} vs "
          f"{[r['metrics']['p']['optimizer_steps'] for r in ranks]}; loss {m_ref['p']['loss']:.6f} vs "
          f"{ranks[0]['metrics']['p']['loss']:.6f}")
    assert moved > 1e-3
    assert across == 0.0  # every rank applies the same summed gradient
    assert gap < 1e-5
    assert ranks[0]["metrics"]["p"]["optimizer_steps"] == m_ref["p"]["optimizer_steps"] == 2
    assert ranks[0]["metrics"]["p"]["loss"] == pytest.approx(m_ref["p"]["loss"], abs=1e-6)
