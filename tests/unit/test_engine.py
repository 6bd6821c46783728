"""The eager and paged engines on a real (tiny, random) Llama: logprobs, stop rules, prefix sharing, compaction,
LoRA batches, weight updates. The paged engine runs its decode step eagerly on the CPU here; the
GPU tests (tests/gpu) replay the same step as CUDA graphs."""

import copy

import pytest
import torch
from helpers import adapter_logprobs, full_logprobs

from masrl.config import SamplingParams
from masrl.engines.hf import HFEngine
from masrl.engines.paged import PagedEngine
from masrl.messages import GenRequest
from masrl.models import stop_token_ids


def req(prompt, temperature=1.0, max_new_tokens=8, stop=(), adapter=None, ignore_eos=False, top_p=1.0):
    sp = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, stop=tuple(stop),
                        ignore_eos=ignore_eos)
    return GenRequest(list(prompt), sp, adapter=adapter)


def make(kind, model, tok, stops, **kw):
    if kind.startswith("paged"):  # paged-rows: prefills as token rows of the decode step
        return PagedEngine(model, tok, stops, device="cpu", seed=kw.pop("seed", 0), kv_blocks=512, block_size=4,
                           graph_prefill=kind == "paged-rows", **kw)
    return HFEngine(model, tok, stops, fast_path=kind != "hf-forward", **kw)


ENGINES = ["hf-lean", "hf-forward", "paged"]


def prompts_with_shared_prefix(tok, n=4):
    sys_ = "You are a careful assistant. Answer with one number inside answer tags, please, always."
    return [tok(f"{sys_} Question {i}: what is {i} plus {i * 3}?", add_special_tokens=False)["input_ids"] for i in range(n)]


@pytest.mark.parametrize("kind", ENGINES)
def test_logprobs_match_a_full_forward(tiny, kind):
    model, tok = tiny
    eng = make(kind, model, tok, stop_token_ids(tok, model))
    prompts = prompts_with_shared_prefix(tok) + [tok("short", add_special_tokens=False)["input_ids"]]
    reqs = [req(p, temperature=t, max_new_tokens=n) for p, t, n in zip(prompts, [1.0, 0.7, 0.0, 1.3, 1.0], [5, 9, 3, 7, 6])]
    outs = eng.generate(reqs)
    for r, o in zip(reqs, outs):
        assert len(o.completion_ids) == len(o.logprobs) == r.max_new_tokens  # random model: no EOS
        ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        assert torch.allclose(ref, torch.tensor(o.logprobs), atol=1e-4)
        assert o.finish_reason == "length"


@pytest.mark.parametrize("sync_every", [1, 3, 16])
def test_paged_engine_greedy_equals_the_eager_engine(tiny, sync_every):
    """Different lengths make rows finish at different steps: rows leaving the batch and the chunked host
    checks must not change any row's tokens."""
    model, tok = tiny
    prompts = prompts_with_shared_prefix(tok, 6) + [tok("a different start", add_special_tokens=False)["input_ids"]]
    reqs = [req(p, temperature=0.0, max_new_tokens=2 + 3 * i) for i, p in enumerate(prompts)]
    eager = HFEngine(model, tok, [2]).generate(reqs)
    paged = make("paged", model, tok, [2], sync_every=sync_every)
    for a, b in zip(eager, paged.generate(reqs)):
        assert a.completion_ids == b.completion_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    # batches larger than the engine's limit are split, and buffers are reused across calls
    small = make("paged", model, tok, [2], max_batch_size=3)
    assert [o.completion_ids for o in small.generate(reqs)] == [o.completion_ids for o in eager]
    assert [o.completion_ids for o in small.generate(reqs[:2])] == [o.completion_ids for o in eager[:2]]


def test_prefix_sharing_and_compaction_do_not_change_greedy_output(tiny):
    model, tok = tiny
    prompts = prompts_with_shared_prefix(tok, 6)
    reqs = [req(p, temperature=0.0, max_new_tokens=2 + 3 * i) for i, p in enumerate(prompts)]
    shared = HFEngine(model, tok, [2], fast_path=True).generate(reqs)
    plain = HFEngine(model, tok, [2], fast_path=True, min_prefix=10_000, compact_ratio=0.0).generate(reqs)
    hf = HFEngine(model, tok, [2], fast_path=False).generate(reqs)
    one_by_one = [HFEngine(model, tok, [2]).generate([r])[0] for r in reqs]
    paged = make("paged", model, tok, [2]).generate(reqs)  # full prompt blocks shared through the pool
    for a, b, c, d, e in zip(shared, plain, hf, one_by_one, paged):
        assert a.completion_ids == b.completion_ids == c.completion_ids == d.completion_ids == e.completion_ids


@pytest.mark.parametrize("kind", ["hf-lean", "paged"])
def test_stop_token_and_stop_string(tiny, kind):
    model, tok = tiny
    prompt = tok("hello there", add_special_tokens=False)["input_ids"]
    greedy = make(kind, model, tok, [2]).generate([req(prompt, temperature=0.0, max_new_tokens=6)])[0]
    # make the 3rd greedy token a stop token: generation ends there, the stop token is kept
    stop_at = greedy.completion_ids[2]
    out = make(kind, model, tok, [stop_at]).generate([req(prompt, temperature=0.0, max_new_tokens=6)])[0]
    assert out.completion_ids == greedy.completion_ids[: greedy.completion_ids.index(stop_at) + 1]
    assert out.finish_reason == "stop"
    # a stop string that appears in the greedy text
    text = greedy.text
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    if needle.strip():
        out = make(kind, model, tok, [2]).generate([req(prompt, temperature=0.0, max_new_tokens=6, stop=(needle,))])[0]
        assert needle in out.text and out.finish_reason == "stop" and len(out.completion_ids) <= 6
        ref = HFEngine(model, tok, [2]).generate([req(prompt, temperature=0.0, max_new_tokens=6, stop=(needle,))])[0]
        assert out.completion_ids == ref.completion_ids
    # ignore_eos runs to the limit even through stop tokens
    out = make(kind, model, tok, [stop_at]).generate([req(prompt, temperature=0.0, max_new_tokens=6, ignore_eos=True)])[0]
    assert len(out.completion_ids) == 6 and out.finish_reason == "length"


def _lora_model(tiny):
    from peft import LoraConfig, get_peft_model

    model, tok = tiny
    base = copy.deepcopy(model)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "o_proj"], task_type="CAUSAL_LM")
    pm = get_peft_model(base, cfg, adapter_name="a")
    pm.add_adapter("b", LoraConfig(r=2, lora_alpha=8, target_modules=["k_proj", "down_proj", "gate_proj"],
                                   task_type="CAUSAL_LM"))
    torch.manual_seed(0)
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    pm.eval()
    return pm, tok


@pytest.mark.parametrize("kind", ["hf-lean", "paged", "paged-rows"])
def test_lora_mixed_adapter_batch_equals_separate_runs(tiny, kind):
    pm, tok = _lora_model(tiny)
    prompts = prompts_with_shared_prefix(tok, 4) + prompts_with_shared_prefix(tok, 2)
    adapters = ["a", "b", "a", "b", None, "a"]
    reqs = [req(p, temperature=0.0, max_new_tokens=5, adapter=a) for p, a in zip(prompts, adapters)]
    mixed = make(kind, pm, tok, [2]).generate(reqs)
    for r, m in zip(reqs, mixed):
        ref = adapter_logprobs(pm, r.adapter, r.prompt_ids, m.completion_ids)
        assert torch.allclose(ref, torch.tensor(m.logprobs), atol=1e-4)
        alone = make(kind, pm, tok, [2]).generate([r])[0]
        assert alone.completion_ids == m.completion_ids
    # the adapters really change the outputs: the same prompts under the bare base differ
    base_out = make(kind, pm, tok, [2]).generate([req(r.prompt_ids, temperature=0.0, max_new_tokens=5) for r in reqs])
    assert [o.completion_ids for o in base_out] != [m.completion_ids for m in mixed]


def test_a_lora_base_is_held_once_its_q_k_v_and_gate_up_the_engines_fused_rows(tiny):
    from masrl.engines.paged.weights import DecodeWeights
    from masrl.modeling.sizes import tensor_bytes

    pm, tok = _lora_model(tiny)
    layer = pm.base_model.model.model.layers[0]
    qkv = [m.base_layer.weight if hasattr(m, "base_layer") else m.weight
           for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)]
    before = tensor_bytes(list(pm.parameters()))
    reqs = [req(p, temperature=0.0, max_new_tokens=5, adapter=a)
            for p, a in zip(prompts_with_shared_prefix(tok, 3), ["a", "b", None])]
    first = make("paged", pm, tok, [2]).generate(reqs)
    w = DecodeWeights(pm, ["a", "b"])
    fused = w.layers[0]["w_qkv"]
    assert w.shared and all(t.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr() for t in qkv)
    assert tensor_bytes(list(pm.parameters())) == before  # the model plus its fused rows: the model's bytes
    lora_cols = tensor_bytes([t for e in w.layers for g in e["lora"].values() for t in (g.a, g.b)])
    assert w.nbytes() == lora_cols
    # a second engine on the same model finds the rows already fused: no copy
    assert DecodeWeights(pm, ["a", "b"]).layers[0]["w_qkv"].data_ptr() == fused.data_ptr()
    # weights parked in CPU memory come back as separate tensors (offload.PinnedStash); the next engine fuses them again
    for t in qkv:
        t.data = t.data.clone()
    assert qkv[0].untyped_storage().data_ptr() != qkv[1].untyped_storage().data_ptr()
    again = make("paged", pm, tok, [2]).generate(reqs)
    assert [o.completion_ids for o in again] == [o.completion_ids for o in first]
    assert qkv[0].untyped_storage().data_ptr() == qkv[1].untyped_storage().data_ptr()
    for r, o in zip(reqs, again):
        assert torch.allclose(adapter_logprobs(pm, r.adapter, r.prompt_ids, o.completion_ids),
                              torch.tensor(o.logprobs), atol=1e-4)


def test_a_trained_full_model_keeps_its_own_weights_beside_the_fused_copies(tiny):
    from masrl.engines.paged.weights import DecodeWeights

    model, _ = tiny
    model = copy.deepcopy(model)
    w = DecodeWeights(model, [])
    q = model.model.layers[0].self_attn.q_proj.weight
    assert not w.shared and q.untyped_storage().data_ptr() != w.layers[0]["w_qkv"].untyped_storage().data_ptr()
    assert w.nbytes() > 0


def test_paged_engine_sees_weight_updates_after_weights_updated(tiny):
    """The paged engine reads fused copies of some weights; ``weights_updated`` refreshes them."""
    model, tok = tiny
    model = copy.deepcopy(model)
    prompts = prompts_with_shared_prefix(tok, 3)
    reqs = [req(p, temperature=0.0, max_new_tokens=6) for p in prompts]
    eng = make("paged", model, tok, [2])
    before = eng.generate(reqs)
    torch.manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            for lin in (layer.self_attn.q_proj, layer.self_attn.v_proj, layer.mlp.up_proj):
                lin.weight.normal_(std=0.3)
    truth = HFEngine(model, tok, [2]).generate(reqs)
    assert [o.completion_ids for o in truth] != [o.completion_ids for o in before]
    stale = eng.generate(reqs)
    gaps = [abs(a - b) for o, t in zip(stale, truth) for a, b in zip(o.logprobs[1:], t.logprobs[1:])]
    assert max(gaps) > 1e-3  # decode steps still read the old fused weights
    eng.weights_updated()
    after = eng.generate(reqs)
    assert [o.completion_ids for o in after] == [o.completion_ids for o in truth]
    for a, t in zip(after, truth):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(t.logprobs), atol=1e-4)


def test_sampling_is_seeded(tiny):
    model, tok = tiny
    prompts = prompts_with_shared_prefix(tok, 3)
    reqs = [req(p, temperature=1.0, top_p=0.9, max_new_tokens=6) for p in prompts]
    a = make("paged", model, tok, [2], seed=5).generate(reqs)
    b = make("paged", model, tok, [2], seed=5).generate(reqs)
    assert [o.completion_ids for o in a] == [o.completion_ids for o in b]


@pytest.mark.parametrize("kind", ["hf-lean", "paged"])
def test_seeded_calls_sample_the_same_tokens_whatever_their_batch(tiny, kind):
    model, tok = tiny
    prompts = prompts_with_shared_prefix(tok, 5)
    reqs = [GenRequest(p, SamplingParams(temperature=1.0, top_p=0.95 if i % 2 else 1.0, max_new_tokens=4 + i),
                       seed=1000 + i) for i, p in enumerate(prompts)]
    together = make(kind, model, tok, [2], seed=1).generate(reqs)
    alone = [make(kind, model, tok, [2], seed=99).generate([r])[0] for r in reqs]
    reordered = make(kind, model, tok, [2], seed=7).generate(reqs[::-1])[::-1]
    assert [o.completion_ids for o in together] == [o.completion_ids for o in alone] == [o.completion_ids for o in reordered]
    other = make("paged" if kind == "hf-lean" else "hf-lean", model, tok, [2]).generate(reqs)
    assert [o.completion_ids for o in other] == [o.completion_ids for o in together]  # both engines agree
    reseeded = make(kind, model, tok, [2]).generate([GenRequest(r.prompt_ids, r.sampling, seed=r.seed + 1) for r in reqs])
    assert [o.completion_ids for o in reseeded] != [o.completion_ids for o in together]


def test_bf16_decode_on_a_cpu_runs_attention_as_matmuls_and_keeps_the_logprobs(tiny, monkeypatch):
    """A bf16 model on a CPU decodes through ``few_query_attention`` (SDPA's CPU math kernel is ~10x
    slower there); its logprobs agree with a plain bf16 forward as closely as the SDPA path's do."""
    import masrl.modeling.lean as lean

    model, tok = tiny
    m16 = copy.deepcopy(model).to(torch.bfloat16)
    prompts = prompts_with_shared_prefix(tok) + [tok("short", add_special_tokens=False)["input_ids"]]
    reqs = [req(p, temperature=t, max_new_tokens=6) for p, t in zip(prompts, [1.0, 0.7, 0.0, 1.3, 1.0])]
    calls = []
    real = lean.few_query_attention
    monkeypatch.setattr(lean, "few_query_attention", lambda *a: calls.append(a[0].shape) or real(*a))

    def errors(few_queries: int):  # each call's largest logprob gap to a plain bf16 forward of its own tokens
        eng = HFEngine(m16, tok, stop_token_ids(tok, m16))
        eng.stepper.few_queries = few_queries
        outs = eng.generate(reqs)
        return [(full_logprobs(m16, r.prompt_ids, o.completion_ids, r.sampling.temperature)
                 - torch.tensor(o.logprobs)).abs().max().item() for r, o in zip(reqs, outs)]

    errs = errors(lean.LlamaForward.few_queries)
    assert calls and all(shape[2] <= lean.LlamaForward.few_queries for shape in calls)  # decode steps only
    n = len(calls)
    sdpa_errs = errors(0)  # the SDPA path, for the scale of bf16 error
    assert len(calls) == n  # no decode step took the matmul path
    assert max(errs) < 0.1 and max(errs) <= 2 * max(sdpa_errs) + 1e-3, (errs, sdpa_errs)


def test_every_engine_declares_its_capabilities_and_a_weight_change_runs_where_it_may(tiny):
    """The worker reads the Engine protocol's capabilities and asks no engine what it has: each engine declares
    them; the paged engine swaps weights between steps, the others run the change at once."""
    from masrl.engines.base import Engine
    from masrl.engines.vllm_engine import VLLMEngine

    model, tok = tiny
    stops = stop_token_ids(tok)
    for cls in (HFEngine, PagedEngine, VLLMEngine):
        assert {"joins_running_decode", "swaps_between_steps", "at_boundary", "take_counters"} <= set(dir(cls)), cls
    assert PagedEngine.joins_running_decode and PagedEngine.swaps_between_steps
    assert not HFEngine.swaps_between_steps and not HFEngine.joins_running_decode
    for kind in ("hf", "paged"):
        eng = HFEngine(model, tok, stops) if kind == "hf" else make(kind, model, tok, stops)
        assert isinstance(eng, Engine)
        ran = []
        eng.at_boundary(lambda ran=ran, kind=kind: ran.append(kind))  # no call running: every engine runs it now
        assert ran == [kind]
        eng.generate([req([5, 6, 7], max_new_tokens=3)])
        counters = eng.take_counters()
        assert (set(counters) == {"preemptions", "pool_peak"}) if kind == "paged" else counters == {}


def test_vllm_takes_the_trainers_64_bit_call_seeds_and_the_paged_engines_kv_setting(tiny, monkeypatch):
    """vLLM's seed is a C long: the trainer's 64-bit call seeds are folded into it (small seeds unchanged); on CUDA
    ``rollout.gpu_memory_utilization`` becomes vLLM's KV bytes, and its start-up check asks for the weights, that
    cache and 2 GiB (an 80 GiB card stood in for by its properties)."""
    import types

    from masrl.engines.vllm_engine import _seed, vllm_memory

    assert _seed(None) is None and _seed(7) == 7 and _seed(2**63 - 1) == 2**63 - 1
    assert _seed(2**64 - 1) == 2**63 - 1 and 0 <= _seed(2**63 + 5) < 2**63 and _seed(2**63 + 5) == 5
    model, _ = tiny
    total = 80 * 2**30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: types.SimpleNamespace(total_memory=total))
    got = vllm_memory(model, "cuda:0", 0.04)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert got["kv_cache_memory_bytes"] == int(0.04 * total)
    assert got["gpu_memory_utilization"] == (int(0.04 * total) + weights + 2 * 2**30) / total


@pytest.mark.parametrize("lora", [False, True])
def test_the_paged_engine_says_when_it_samples_weights_older_than_the_models(tiny, lora):
    """Its fused q/k/v and gate/up rows and LoRA columns are copies: a weight change it was not told of leaves
    them old (it would sample the old policy), which ``stale_weights`` names; told, it samples the new ones."""
    if lora:
        model, tok = _lora_model(tiny)
        layer = model.base_model.model.model.layers[1]
        changed, told = layer.self_attn.v_proj.lora_B["a"].weight, ["a"]
    else:
        model, tok = copy.deepcopy(tiny[0]), tiny[1]
        layer = model.model.layers[1]
        changed, told = layer.mlp.up_proj.weight, None
    eng = make("paged", model, tok, [2])
    prompt = prompts_with_shared_prefix(tok, 1)[0]
    ask = req(prompt, temperature=0.0, max_new_tokens=4, adapter="a" if lora else None)
    eng.generate([ask])
    assert eng.stale_weights() == []
    with torch.no_grad():
        changed.add_(1.0)  # an optimizer step the engine was not told of
    assert eng.stale_weights() == (["layer 1 qkv LoRA 'a'"] if lora else ["layer 1 gate/up"])
    eng.weights_updated(told)
    assert eng.stale_weights() == []


def test_fp32_adapters_over_a_bf16_base_are_not_taken_for_stale(tiny):
    """The columns hold the adapters in the base's dtype (as ``_fill_lora`` writes them): compared in that dtype."""
    from masrl.engines.paged.weights import DecodeWeights

    pm, _ = _lora_model(tiny)
    for n, p in pm.named_parameters():
        if "lora_" not in n:
            p.data = p.data.to(torch.bfloat16)
    assert all(p.dtype == torch.float32 for n, p in pm.named_parameters() if "lora_" in n)
    w = DecodeWeights(pm, ["a", "b"])
    assert w.layers[0]["lora"]["qkv"].b.dtype == torch.bfloat16 and w.stale() == []
    with torch.no_grad():
        pm.base_model.model.model.layers[0].self_attn.q_proj.lora_A["a"].weight.mul_(3.0)
    assert w.stale() == ["layer 0 qkv LoRA 'a'"]


@pytest.mark.parametrize("kind", ["hf-lean", "paged"])
def test_every_engine_tells_on_done_of_each_row(tiny, kind):
    """``Engine.generate(requests, on_done)``: each row is told once, with the output the list returns (the eager
    engine after its batch, the paged one as each row ends)."""
    model, tok = tiny
    told = {}
    eng = make(kind, model, tok, stop_token_ids(tok, model))
    reqs = [req([1, 5, 9], temperature=0.0, max_new_tokens=n) for n in (2, 7, 4)]
    out = eng.generate(reqs, lambda i, o: told.setdefault(i, []).append(o))
    assert sorted(told) == [0, 1, 2] and all(len(v) == 1 for v in told.values())
    assert [told[i][0].completion_ids for i in range(3)] == [o.completion_ids for o in out]
    assert [len(o.completion_ids) for o in out] == [2, 7, 4]


def test_the_paged_engines_counters_survive_a_release(tiny):
    """``release`` (offload_weights parks a worker every step) drops the pool and the scheduler; the engine's one
    stats object keeps counting across it, so pre-emptions taken after a rebuild are never negative or lost."""
    model, tok = tiny
    eng = PagedEngine(model, tok, stop_token_ids(tok, model), device="cpu", seed=0, kv_blocks=9, block_size=4)
    reqs = [req(list(range(10 + i, 16 + i)), max_new_tokens=12, ignore_eos=True) for i in range(4)]  # 18 slots each
    eng.generate(reqs)
    first = eng.stats["preemptions"]
    assert first > 0 and eng.take_counters()["preemptions"] == first
    eng.release()
    eng.generate(reqs)
    assert eng.stats["preemptions"] > first  # cumulative: the rebuilt scheduler's count adds to the engine's
    assert eng.take_counters()["preemptions"] == eng.stats["preemptions"] - first > 0
    assert eng.stats["prefill_tokens"] > 0 and eng.stats["hit_blocks"] + eng.stats["miss_blocks"] > 0
