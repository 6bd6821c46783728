"""policies.X.fsdp on a GPU (one rank over NCCL: the CUDA path of worker.sharding): bf16 compute
over fp32 shards, packed rows through the FSDP blocks, fused AdamW on DTensors, the gathered bf16
engine copy sampling with CUDA graphs, and a sharded checkpoint that loads back exactly. The update
matches the unsharded bf16 worker's (bf16 weights with fp32 masters): the same loss and gradient
norm to bf16 rounding, and an update in the same direction (AdamW's first step is close to the sign
of each gradient element, so elements whose gradient is near zero may go either way)."""

import copy
import socket

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp_on_one_gpu_updates_like_the_unsharded_worker_and_resumes(tmp_path):
    import torch.distributed as dist

    from masrl.config import AlgorithmConfig, OptimConfig, SamplingParams
    from masrl.messages import GenCall
    from masrl.policies import PolicySpec
    from masrl.worker.policy_worker import PolicyWorker
    from masrl.worker.updater.training import Learner

    algo = AlgorithmConfig(micro_batch_size=4, mini_batches=1, group_key=["task_id"])

    def worker(fsdp: bool):
        spec = PolicySpec("p", "random-smollm2-135m", optim=OptimConfig(lr=1e-2), device="cuda:0", fsdp=fsdp,
                          data_parallel=2 if fsdp else 1)
        return PolicyWorker("random-smollm2-135m", [spec], algo, device="cuda:0", precision="bf16", seed=0)

    plain = worker(False)
    sp = SamplingParams(temperature=1.0, max_new_tokens=24)
    calls = [GenCall(f"c{i}", "p", [{"role": "user", "content": f"What is {i} + {i * 7}?"}], sp,
                     key={"task_id": f"t{i % 4}"}, seed=100 + i) for i in range(16)]
    plain.generate(calls)
    plain.commit_rewards({f"c{i}": float((i * 37) % 5) / 4 for i in range(16)})
    samples = copy.deepcopy(list(plain.sampler.buffer.values()))
    before = {k: v.float().clone() for k, v in plain.held.model.state_dict().items()}
    m_plain = plain.train_step()["p"]
    after = {k: v.float() for k, v in plain.held.model.state_dict().items()}

    w = worker(True)
    w.join_ranks(f"tcp://127.0.0.1:{_port()}", 0, 1, "cpu:gloo,cuda:nccl")
    try:
        assert Learner(w.held, algo).layout() == "packed"
        w.sampler.buffer = {s.call_id: s for s in copy.deepcopy(samples)}
        m = w.train_step()["p"]
        got = {k: v.float() for k, v in w.sampler.copy.model.state_dict().items()}
        d_plain = torch.cat([(after[k] - before[k]).flatten() for k in after])
        d_fsdp = torch.cat([(got[k] - before[k]).flatten() for k in after])
        cos = torch.nn.functional.cosine_similarity(d_plain, d_fsdp, dim=0).item()
        out = w.generate([GenCall("g", "p", [{"role": "user", "content": "What is 2 + 2?"}], sp, seed=5)])[0]
        w.save(str(tmp_path / "ckpt"))
        w2 = worker(True)
        w2.join_ranks("unused", 0, 1)  # the process group is already there
        w2.load(str(tmp_path / "ckpt"))
        back = max((w2.sampler.copy.model.state_dict()[k].float() - got[k]).abs().max().item() for k in got)
        print(f"[gpu] fsdp (1 rank) vs unsharded bf16: loss {m['loss']:.6f} vs {m_plain['loss']:.6f}, grad norm "
              f"{m['grad_norm']:.4f} vs {m_plain['grad_norm']:.4f}; cosine of the two updates {cos:.4f}; "
              f"weight sync {m['weight_sync_s'] * 1e3:.1f} ms for {m['weight_sync_gb']:.3f} GiB; sampled "
              f"{out.n_completion_tokens} tokens; engine {w.sampler.engine.stats.get('graphs_captured')} graphs; "
              f"resumed gap {back:.1e}")
        assert m["optimizer_steps"] == m_plain["optimizer_steps"] == 1
        # the PPO loss at the sampling weights is near 0 (advantages sum to 0 in a group); what is left is
        # the bf16 logprob noise (about 2e-3 a token) times the advantages
        assert abs(m["loss"] - m_plain["loss"]) < 1e-3
        assert m["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=0.02)
        assert cos > 0.9
        assert out.n_completion_tokens > 0
        assert back == 0.0
    finally:
        dist.destroy_process_group()
