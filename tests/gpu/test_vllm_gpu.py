"""rollout.engine: vllm on a GPU (vLLM 0.24.0 from scripts/gpu/vllm_install.sh): bf16 logprobs against the trainer's
forward (beside the paged engine's on the same calls), full-weight and adapter syncs timed, and the shipped LoRA
team, async mode and the gateway's outside team training on vLLM's samples through the CLI."""

import os
import subprocess
import sys
import time

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm", reason="vLLM is not installed (scripts/gpu/vllm_install.sh on the GPU host)")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import adapter_logprobs, full_logprobs  # noqa: E402
from test_gpu import lora_async_samples_the_version_it_claims, prompts, report, req, two_adapter_model  # noqa: E402

KV = 0.02  # each engine's KV cache: 2% of the card, so that the engines of this file fit side by side


def gaps(model, reqs, outs, adapters=False):
    got = []
    for r, o in zip(reqs, outs):
        ref = (adapter_logprobs(model, r.adapter, r.prompt_ids, o.completion_ids, r.sampling.temperature) if adapters
               else full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature))
        got += (ref - torch.tensor(o.logprobs)).abs().tolist()
    return got


def test_vllm_bf16_logprobs_match_the_forward_as_the_paged_engines_do_and_a_weight_sync_is_timed():
    from masrl.engines.paged import PagedEngine
    from masrl.engines.vllm_engine import VLLMEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.bfloat16, device="cuda")
    ps = prompts(tok, 6) + prompts(tok, 3, shared=False)
    reqs = [req(p, temperature=t, max_new_tokens=n, seed=i)
            for i, (p, t, n) in enumerate(zip(ps, [1.0, 0.7, 0.0] * 3, [5, 17, 9, 33, 3, 12, 8, 40, 2]))]
    t0 = time.perf_counter()
    eng = VLLMEngine(model, tok, [tok.eos_token_id], device="cuda:0", gpu_memory_utilization=KV)
    start = time.perf_counter() - t0
    v = report("vLLM vs HF forward, bf16", gaps(model, reqs, eng.generate(reqs)))
    p = report("paged engine vs HF forward, bf16 (same calls)",
               gaps(model, reqs, PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0").generate(reqs)))
    assert v.mean() < 0.05 and v.max() < 0.5 and len(v) > 50
    with torch.no_grad():  # the trainer's weights change
        for prm in model.model.layers[3].mlp.parameters():
            prm.mul_(1.5)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    eng.weights_updated()
    sync_s = time.perf_counter() - t0
    after = report("vLLM vs HF forward after the weights changed and were pushed", gaps(model, reqs, eng.generate(reqs)))
    print(f"[gpu] vLLM start {start:.1f} s; full-weight sync of {sum(x.numel() for x in model.parameters()) / 1e6:.0f}M "
          f"parameters: {sync_s * 1e3:.0f} ms; paged mean gap {p.mean():.2e}")
    assert after.mean() < 0.05 and after.max() < 0.5 and eng.stats["weight_syncs"] == 1
    assert eng.stale_weights() == []
    with torch.no_grad():  # a change vLLM is not told of is read back as stale
        model.model.layers[5].self_attn.o_proj.weight.mul_(1.25)
    assert eng.stale_weights() == ["model.layers.5.self_attn.o_proj.weight"]
    eng.weights_updated()
    assert eng.stale_weights() == []


def test_lora_async_on_vllm_samples_the_version_it_claims(tmp_path):
    lora_async_samples_the_version_it_claims(tmp_path, "vllm", gpu_memory_utilization=KV)


def test_vllm_serves_two_adapters_and_the_base_in_one_batch_and_takes_a_new_adapter():
    from masrl.engines.vllm_engine import VLLMEngine

    pm, tok = two_adapter_model()
    pm = pm.to(torch.bfloat16)
    eng = VLLMEngine(pm, tok, [tok.eos_token_id], device="cuda:0", gpu_memory_utilization=KV)
    adapters = ["a", "b", None, "a", "b", "b", "a", None]
    reqs = [req(p, temperature=1.0, max_new_tokens=12, adapter=a, seed=i)
            for i, (p, a) in enumerate(zip(prompts(tok, 8), adapters))]
    g0 = report("vLLM LoRA mixed batch vs per-adapter PEFT forward, bf16", gaps(pm, reqs, eng.generate(reqs), True))
    with torch.no_grad():
        for n, prm in pm.named_parameters():
            if "lora_B" in n and ".a." in n:
                prm.mul_(3.0)
    t0 = time.perf_counter()
    eng.weights_updated(["a"])
    sync_s = time.perf_counter() - t0
    g1 = report("after adapter a changed and was re-registered", gaps(pm, reqs, eng.generate(reqs), True))
    print(f"[gpu] adapter sync (write + register): {sync_s * 1e3:.0f} ms; ids {eng.lora_ids}")
    assert g0.mean() < 0.05 and g0.max() < 0.5 and g1.mean() < 0.05 and g1.max() < 0.5
    assert eng.lora_ids == {"a": 3, "b": 2}


def _cli(tmp_path, name, config, *overrides):
    cmd = [sys.executable, "-m", "masrl.cli", "train", config, "device=cuda", "model=random-smollm2-135m",
           "rollout.engine=vllm", f"rollout.gpu_memory_utilization={KV}", "train.eval_before=false",
           "train.eval_after=false", *overrides, f"output_dir={tmp_path / name}"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    print(f"[gpu] {name}: {time.perf_counter() - t0:.0f} s\n{out.stdout[-1500:]}\n{out.stderr[-2500:]}")
    assert out.returncode == 0
    return out.stdout


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_lora_team_trains_on_vllm(tmp_path, mode):
    out = _cli(tmp_path, f"team_lora_{mode}", "math/team_lora", "train.steps=2", f"rollout.mode={mode}",
               "data.train.n=40", "rollout.tasks_per_step=4", "rollout.samples_per_task=4",
               "rewards=[{type: outcome}, {type: format, weight: 0.5}, {type: 'helpers:agent_hash_reward'}]")
    assert "step 2/2" in out and "on cuda:0" in out
    assert (tmp_path / f"team_lora_{mode}" / "checkpoints" / "step_000002" / "solver" / "adapter.safetensors").is_file()


def test_the_gateway_team_trains_on_vllm(tmp_path):
    out = _cli(tmp_path, "gateway", "examples/external_openai_team.yaml", "train.steps=1", "train.save_every=0",
               "rollout.tasks_per_step=2", "rollout.samples_per_task=2",
               "rewards=[{type: outcome}, {type: 'helpers:agent_hash_reward'}]")
    assert "step 1/1" in out
