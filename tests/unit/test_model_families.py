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
@pytest.mark.parametrize("engine", ["hf", "static"])
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
    from masrl.worker import training
    from masrl.worker.batching import Sample, make_batch
    from masrl.worker.hosting import ModelHost

    _, tok = tiny
    model = build(name.split("-")[0], tok)
    model.save_pretrained(tmp_path / name)
    tok.save_pretrained(tmp_path / name)
    host = ModelHost(str(tmp_path / name), [PolicySpec("p", str(tmp_path / name))])
    prompts = [tok(f"Say {i} then stop, please, kindly, right now.", add_special_tokens=False)["input_ids"] for i in range(3)]
    samples = [Sample(f"c{i}", "p", p, [5 + i, 9, 11, 40 + i], [0.0] * 4, 1.0, {}) for i, p in enumerate(prompts)]
    with torch.no_grad():
        lp, _, _ = training.completion_forward(host, host.core, make_batch(samples, 2, layout="padded"))
    for i, s in enumerate(samples):
        assert torch.allclose(lp[i, :4], full_logprobs(host.model, s.prompt_ids, s.completion_ids, 1.0), atol=1e-4)
    fast = host.fast_forward(host.core)
    if name == "mistral-sliding":
        assert fast is None and "sliding-window attention" in capsys.readouterr().err
    else:
        assert fast is not None


def test_sliding_window_models_never_get_the_static_engine(tiny):
    from masrl.errors import ConfigError

    _, tok = tiny
    model = build("mistral", tok)
    assert "sliding-window" in lean.unsupported(model)
    with pytest.raises(ConfigError, match="static cannot run this model"):
        make_engine("static", model, tok, [2], device="cpu", seed=0)
    assert type(make_engine("auto", model, tok, [2], device="cpu", seed=0)).__name__ == "HFEngine"
