"""Qwen2 (q/k/v biases), Qwen3 (per-head q/k norms) and Llama 3 (scaled RoPE) run through the fast
path and match the plain HF forward, in both engines and in the trainer; a sliding-window Mistral
falls back to the plain forward with a notice, never to different numbers."""

import pytest
import torch
from helpers import full_logprobs
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from masrl.config import SamplingParams
from masrl.engines.base import make_engine
from masrl.messages import GenRequest
from masrl.modeling import lean

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def family(name, vocab):
    if name == "qwen2":
        return Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, **SMALL)
    if name == "qwen3":
        return Qwen3Config(vocab_size=vocab, head_dim=16, tie_word_embeddings=True, **SMALL)
    if name == "llama3":
        return LlamaConfig(vocab_size=vocab, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                           "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": 64}, **SMALL)
    return MistralConfig(vocab_size=vocab, sliding_window=16, **SMALL)


def build(name, tok):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family(name, len(tok))).eval()
    if name == "qwen3":  # non-trivial norm weights, so a missing q/k norm shows
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
                layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "llama3"])
@pytest.mark.parametrize("engine", ["hf", "paged"])
def test_fast_path_matches_the_plain_forward(tiny, name, engine):
    _, tok = tiny
    model = build(name, tok)
    assert lean.supports(model)
    eng = make_engine(engine, model, tok, [2], device="cpu", seed=0)
    prompts = [tok(f"Question {i}: what is {i} plus {i * 3}? Think.", add_special_tokens=False)["input_ids"] for i in range(3)]
    outs = eng.generate([GenRequest(p, SamplingParams(temperature=t, max_new_tokens=6))
                         for p, t in zip(prompts, [1.0, 0.0, 0.7])])
    for p, o, t in zip(prompts, outs, [1.0, 0.0, 0.7]):
        ref = full_logprobs(model, p, o.completion_ids, t)
        assert torch.allclose(ref, torch.tensor(o.logprobs), atol=1e-4), name


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "llama3", "mistral-sliding"])
def test_trainer_logprobs_match_the_plain_forward(tmp_path, tiny, name, capsys):
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel
    from masrl.worker.updater import training
    from masrl.worker.updater.batching import Sample, make_batch

    _, tok = tiny
    model = build(name.split("-")[0], tok)
    model.save_pretrained(tmp_path / name)
    tok.save_pretrained(tmp_path / name)
    host = HeldModel(str(tmp_path / name), [PolicySpec("p", str(tmp_path / name))])
    prompts = [tok(f"Say {i} then stop, please, kindly, right now.", add_special_tokens=False)["input_ids"] for i in range(3)]
    samples = [Sample(f"c{i}", "p", p, [5 + i, 9, 11, 40 + i], [0.0] * 4, 1.0, {}) for i, p in enumerate(prompts)]
    with torch.no_grad():
        lp, _, _ = training.Learner(host).completion_forward(host.core, make_batch(samples, 2, layout="padded"))
    for i, s in enumerate(samples):
        assert torch.allclose(lp[i, :4], full_logprobs(host.model, s.prompt_ids, s.completion_ids, 1.0), atol=1e-4)
    fast = host.fast_forward(host.core)
    if name == "mistral-sliding":
        assert fast is None and "sliding-window attention" in capsys.readouterr().err
    else:
        assert fast is not None


def test_sliding_window_models_never_get_the_paged_engine(tiny):
    from masrl.errors import ConfigError

    _, tok = tiny
    model = build("mistral", tok)
    assert "sliding-window" in lean.unsupported(model)
    with pytest.raises(ConfigError, match="paged cannot run this model"):
        make_engine("paged", model, tok, [2], device="cpu", seed=0)
    assert type(make_engine("auto", model, tok, [2], device="cpu", seed=0)).__name__ == "HFEngine"


def test_auto_engine_is_paged_on_cuda_and_its_options_follow():
    """``rollout.engine: auto`` resolves once (``auto_kind``): the paged engine on CUDA, with its budget
    among the options the worker passes; the eager engine on a CPU, with none."""
    from masrl.config.sections import RolloutConfig
    from masrl.driver.builder import engine_options
    from masrl.engines.base import auto_kind

    assert auto_kind("cuda") == "paged" and auto_kind("cuda:1") == "paged" and auto_kind("cpu") == "hf"
    r = RolloutConfig(gpu_memory_utilization=0.07, kv_block_size=32, graph_prefill=True)
    on_gpu = engine_options(r, "cuda:0")
    assert on_gpu["gpu_memory_utilization"] == 0.07 and on_gpu["block_size"] == 32 and on_gpu["graph_prefill"]
    assert engine_options(RolloutConfig(), "cuda:0")["graph_prefill"] is None  # the engine decides: where graphs are
    assert engine_options(RolloutConfig(overlap_chunks=False), "cuda:0")["overlap_chunks"] is False
    assert engine_options(r, "cpu") == {}
    vllm = engine_options(RolloutConfig(engine="vllm", gpu_memory_utilization=0.07), "cuda")
    assert vllm == {"cuda_graphs": True, "max_batch_size": 64, "gpu_memory_utilization": 0.07}
    with pytest.raises(ValueError, match="static engine was retired"):
        RolloutConfig(engine="static")


def test_only_a_paged_engine_says_it_joins_batches(tiny):
    """The driver hands a host several batches at once only when its engine takes them into one running
    decode; an eager fallback (a model the lean forward cannot run) never says so."""
    _, tok = tiny
    model = build("mistral", tok)
    assert not getattr(make_engine("auto", model, tok, [2], device="cpu", seed=0), "joins_running_decode", False)
    qwen2 = build("qwen2", tok)
    paged = make_engine("paged", qwen2, tok, [2], device="cpu", seed=0, gpu_memory_utilization=0.001)
    assert paged.joins_running_decode
    assert not make_engine("hf", qwen2, tok, [2], device="cpu", seed=0).joins_running_decode


def test_grouped_keys_repeated_for_a_masked_attention_give_the_grouped_result():
    """``lean.masked_attention`` repeats grouped-query keys and values on CUDA (SDPA has no fused kernel for a
    mask with ``enable_gqa``); ``repeat_kv`` must give query head h key head h // (H / KV), as SDPA's GQA does."""
    g = torch.Generator().manual_seed(0)
    B, H, KV, S, K, D = 2, 6, 2, 5, 9, 8
    q, k, v = (torch.randn(B, n, s, D, generator=g) for n, s in ((H, S), (KV, K), (KV, K)))
    mask = lean.causal_mask(torch.tensor([[True] * K, [False] * 3 + [True] * 6]), K - S, S)
    grouped = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    rk, rv = lean.repeat_kv(k, v, H)
    assert rk.shape == (B, H, K, D) and torch.equal(rk[:, 1], k[:, 0]) and torch.equal(rv[:, 3], v[:, 1])
    repeated = torch.nn.functional.scaled_dot_product_attention(q, rk, rv, attn_mask=mask)
    torch.testing.assert_close(repeated, grouped, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lean.masked_attention(q, k, v, mask, D**-0.5, True), grouped, rtol=1e-6, atol=1e-6)



def test_an_engine_option_it_does_not_take_is_an_error_naming_it(tiny):
    """The rollout settings reach the engine by name; a key the engine does not take fails loudly (it was dropped)."""
    from masrl.config.sections import RolloutConfig
    from masrl.driver.builder import engine_options
    from masrl.engines.base import _taken
    from masrl.engines.paged import PagedEngine
    from masrl.engines.vllm_engine import VLLMEngine

    _, tok = tiny
    with pytest.raises(TypeError, match="paged engine takes no option 'gpu_memory_utilisation'.*gpu_memory_utilization"):
        make_engine("paged", build("qwen2", tok), tok, [2], device="cpu", seed=0, gpu_memory_utilisation=0.01)
    for kind, cls in (("paged", PagedEngine), ("vllm", VLLMEngine)):  # every key the builder hands is taken
        opts = engine_options(RolloutConfig(engine=kind), "cuda:0")
        assert opts and _taken(cls, kind, opts) == opts
