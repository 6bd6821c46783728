"""The engine on a real (tiny, random) Llama: logprobs, stop rules, prefix sharing, LoRA batches."""

import pytest
import torch

from masrl.engines.hf import GenRequest, HFEngine
from masrl.models import stop_token_ids


def full_logprobs(model, prompt, completion, temperature):
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


def prompts_with_shared_prefix(tok, n=4):
    sys_ = "You are a careful assistant. Answer with one number inside answer tags, please, always."
    return [tok(f"{sys_} Question {i}: what is {i} plus {i * 3}?", add_special_tokens=False)["input_ids"] for i in range(n)]


@pytest.mark.parametrize("fast", [True, False], ids=["lean-forward", "hf-forward"])
def test_logprobs_match_a_full_forward(tiny, fast):
    model, tok = tiny
    eng = HFEngine(model, tok, stop_token_ids(tok, model), seed=0, fast_path=fast)
    prompts = prompts_with_shared_prefix(tok) + [tok("short", add_special_tokens=False)["input_ids"]]
    reqs = [GenRequest(p, temperature=t, max_new_tokens=n) for p, t, n in zip(prompts, [1.0, 0.7, 0.0, 1.3, 1.0], [5, 9, 3, 7, 6])]
    outs = eng.generate(reqs)
    for r, o in zip(reqs, outs):
        assert len(o.completion_ids) == len(o.logprobs) == r.max_new_tokens  # random model: no EOS
        ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.temperature)
        assert torch.allclose(ref, torch.tensor(o.logprobs), atol=1e-4)
        assert o.finish_reason == "length"


def test_prefix_sharing_and_compaction_do_not_change_greedy_output(tiny):
    model, tok = tiny
    prompts = prompts_with_shared_prefix(tok, 6)
    reqs = [GenRequest(p, temperature=0.0, max_new_tokens=2 + 3 * i) for i, p in enumerate(prompts)]
    shared = HFEngine(model, tok, [2], fast_path=True).generate(reqs)
    plain = HFEngine(model, tok, [2], fast_path=True, min_prefix=10_000, compact_ratio=0.0).generate(reqs)
    hf = HFEngine(model, tok, [2], fast_path=False).generate(reqs)
    one_by_one = [HFEngine(model, tok, [2]).generate([r])[0] for r in reqs]
    for a, b, c, d in zip(shared, plain, hf, one_by_one):
        assert a.completion_ids == b.completion_ids == c.completion_ids == d.completion_ids


def test_stop_token_and_stop_string(tiny):
    model, tok = tiny
    prompt = tok("hello there", add_special_tokens=False)["input_ids"]
    greedy = HFEngine(model, tok, [2]).generate([GenRequest(prompt, temperature=0.0, max_new_tokens=6)])[0]
    # make the 3rd greedy token a stop token: generation ends there, the stop token is kept
    stop_at = greedy.completion_ids[2]
    out = HFEngine(model, tok, [stop_at]).generate([GenRequest(prompt, temperature=0.0, max_new_tokens=6)])[0]
    assert out.completion_ids == greedy.completion_ids[: greedy.completion_ids.index(stop_at) + 1]
    assert out.finish_reason == "stop"
    # a stop string that appears in the greedy text
    text = greedy.text
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    if needle.strip():
        out = HFEngine(model, tok, [2]).generate([GenRequest(prompt, temperature=0.0, max_new_tokens=6, stop=(needle,))])[0]
        assert needle in out.text and out.finish_reason == "stop" and len(out.completion_ids) <= 6
    # ignore_eos runs to the limit even through stop tokens
    out = HFEngine(model, tok, [stop_at]).generate([GenRequest(prompt, temperature=0.0, max_new_tokens=6, ignore_eos=True)])[0]
    assert len(out.completion_ids) == 6


def test_lora_mixed_adapter_batch_equals_separate_runs(tiny):
    import copy

    from peft import LoraConfig, get_peft_model

    model, tok = tiny
    base = copy.deepcopy(model)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], task_type="CAUSAL_LM")
    pm = get_peft_model(base, cfg, adapter_name="a")
    pm.add_adapter("b", cfg)
    torch.manual_seed(0)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    pm.eval()
    prompts = prompts_with_shared_prefix(tok, 4)
    adapters = ["a", "b", "a", "b"]
    reqs = [GenRequest(p, temperature=0.0, max_new_tokens=5, adapter=a) for p, a in zip(prompts, adapters)]
    mixed = HFEngine(pm, tok, [2]).generate(reqs)
    for r, m in zip(reqs, mixed):
        pm.set_adapter(r.adapter)
        alone = HFEngine(pm, tok, [2]).generate([GenRequest(r.prompt_ids, temperature=0.0, max_new_tokens=5,
                                                            adapter=r.adapter)])[0]
        ref = full_logprobs(pm, r.prompt_ids, m.completion_ids, 0.0)
        assert torch.allclose(ref, torch.tensor(m.logprobs), atol=1e-4)
        assert alone.completion_ids == m.completion_ids
    # the adapters really change the outputs: the same prompts under the bare base differ
    base_out = HFEngine(pm, tok, [2]).generate([GenRequest(r.prompt_ids, temperature=0.0, max_new_tokens=5) for r in reqs])
    assert [o.completion_ids for o in base_out] != [m.completion_ids for m in mixed]
