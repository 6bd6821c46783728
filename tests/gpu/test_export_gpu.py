"""masrl export's LoRA team served by vLLM 0.24 (scripts/gpu/vllm_install.sh on the GPU host): the LoRA math team
trained a step on the GPU (SmolLM2-135M's shape), its adapters moved off zero so that they matter, exported, and
each adapter loaded by vLLM's own ``LoRARequest`` from its exported PEFT folder over the exported base. The
logprobs vLLM gives its sampled tokens match the trainer's forward of the checkpoint (bf16) within the tolerance of
the other vLLM GPU tests."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("vllm", reason="vLLM is not installed (scripts/gpu/vllm_install.sh on the GPU host)")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import adapter_logprobs  # noqa: E402
from test_gpu import report  # noqa: E402

QUESTIONS = ["What is 12 + 7?", "Ana has 5 apples and buys 3 more. How many now?", "What is 9 times 4?",
             "Tom had 20 coins and spent 8. How many are left?"]


def test_an_exported_lora_team_serves_in_vllm_with_the_trainers_logprobs(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "0")  # FlashInfer is not in the wheels (prepare_vllm.sh)
    from safetensors.torch import load_file, save_file
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    from masrl.driver.builder import build_runtime
    from masrl.driver.run.rundir import RunDir

    run = tmp_path / "team"
    train = subprocess.run([sys.executable, "-m", "masrl.cli", "train", "math/team_lora", "device=cuda",
                            "model=random-smollm2-135m", "train.steps=1", "train.eval_before=false",
                            "train.eval_after=false", "data.train.n=16", "rollout.tasks_per_step=2",
                            "rollout.samples_per_task=2", "rollout.gpu_memory_utilization=0.02", f"output_dir={run}"],
                           capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert train.returncode == 0, train.stderr[-3000:]
    ckpt = RunDir(run).latest()
    g = torch.Generator().manual_seed(0)
    policies = ["solver", "verifier", "refiner", "finalizer"]
    for name in policies:  # a step on a random model learns nothing: give every adapter weights that matter
        path = ckpt / name / "adapter.safetensors"
        sd = load_file(str(path))
        save_file({k: (torch.randn(v.shape, generator=g) * 0.05 if "lora_B" in k else v) for k, v in sd.items()},
                  str(path))
    out = tmp_path / "export"
    exported = subprocess.run([sys.executable, "-m", "masrl.cli", "export", str(run), "--to", str(out)],
                              capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert exported.returncode == 0, exported.stderr[-3000:]
    record = json.loads((out / "export.json").read_text())
    assert {p: r["kind"] for p, r in record["policies"].items()} == dict.fromkeys(policies, "lora")

    rt = build_runtime(RunDir(run).config(), log=lambda *_: None)  # the trainer's model, the checkpoint loaded
    try:
        for w in rt.workers:
            w.load(str(ckpt), with_optimizer=False)
        host = rt.workers[0].held
        tok = host.tokenizer
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                      tokenize=False), add_special_tokens=False) for q in QUESTIONS]
        llm = LLM(model=str(out / "base"), enable_lora=True, max_lora_rank=64, max_loras=4, dtype="bfloat16",
                  gpu_memory_utilization=0.15, seed=0, max_model_len=2048, enforce_eager=True,
                  logprobs_mode="processed_logprobs")
        gaps = []
        for i, name in enumerate(policies):
            lora = LoRARequest(name, i + 1, str(out / name))
            got = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(max_tokens=16, temperature=1.0, logprobs=0, seed=i, ignore_eos=True),
                               lora_request=lora)
            for p, g_out in zip(prompts, got):
                o = g_out.outputs[0]
                theirs = torch.tensor([lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs)])
                with torch.no_grad():
                    ours = adapter_logprobs(host.model, name, p, list(o.token_ids), 1.0).float().cpu()
                gaps += (ours - theirs).abs().tolist()
            with torch.no_grad():  # and the adapter is not the base: vLLM serves what was trained
                base = adapter_logprobs(host.model, None, prompts[0], list(got[0].outputs[0].token_ids), 1.0)
                mine = adapter_logprobs(host.model, name, prompts[0], list(got[0].outputs[0].token_ids), 1.0)
            assert (base - mine).abs().max() > 0.05
        g = report("exported LoRA adapters in vLLM vs the trainer's forward, bf16", gaps)
        assert len(g) == 4 * len(prompts) * 16 and g.mean() < 0.05 and g.max() < 0.5
    finally:
        rt.close()
