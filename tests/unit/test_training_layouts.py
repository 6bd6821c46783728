"""The trainer's layouts (shared prefix, right-padded causal), head chunking and activation
checkpointing compute the same logprobs and gradients; micro-batches respect their budgets.
(The packed layout needs CUDA's varlen flash attention: tests/gpu checks it against these.)"""

import pytest
import torch

from masrl.config import AlgorithmConfig, PolicyConfig
from masrl.policies import PolicySpec
from masrl.worker.model.held import HeldModel
from masrl.worker.updater import training
from masrl.worker.updater.batching import Sample, make_batch, micro_batches, prefix_cost


@pytest.fixture(scope="module")
def host():
    return HeldModel("tiny-random", [PolicySpec("p", "tiny-random", optim=PolicyConfig().optim)], seed=0)


def samples_for(host, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    tok = host.tokenizer
    system = "You are a careful assistant. Answer with one number inside answer tags, please, always."
    out = []
    for i in range(n):
        prompt = tok(f"{system} Question {i}: what is {i} plus {i * 7}?", add_special_tokens=False)["input_ids"]
        c = torch.randint(3, 2000, (3 + 2 * i,), generator=g).tolist()
        out.append(Sample(f"c{i}", "p", prompt, c, [-1.0] * len(c), 0.7 if i % 2 else 1.0,
                          {"task_id": i // 2, "agent": "a", "turn": 0}, reward=float(i % 3)))
    return out


def full_logprobs(host, s):
    ids = torch.tensor([s.prompt_ids + s.completion_ids])
    with torch.no_grad():
        logits = host.model(ids).logits[0, len(s.prompt_ids) - 1 : -1].float() / s.temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(s.completion_ids)[:, None]).squeeze(-1)


def logprobs_and_grads(host, samples, layout, **kw):
    host.model.zero_grad(set_to_none=True)
    batch = make_batch(samples, host.tokenizer.pad_token_id, layout=layout)
    logp, _, _ = training.Learner(host).completion_forward(host.core, batch, **kw)
    (logp * batch.token_mask).sum().backward()
    grads = [p.grad.clone() for p in host.model.parameters() if p.grad is not None]
    host.model.zero_grad(set_to_none=True)
    return logp.detach(), grads


def test_layouts_give_the_same_logprobs_and_gradients(host, monkeypatch):
    samples = samples_for(host)
    lp_prefix, g_prefix = logprobs_and_grads(host, samples, "prefix")
    assert make_batch(samples, 2, layout="prefix").prefix.shape[1] >= 16  # the prefix really is shared
    for i, s in enumerate(samples):
        ref = full_logprobs(host, s)
        assert torch.allclose(lp_prefix[i, : len(ref)], ref, atol=1e-4)
    variants = {"padded": logprobs_and_grads(host, samples, "padded"),
                "checkpointed": logprobs_and_grads(host, samples, "padded", checkpoint=True)}
    for name, (lp, grads) in variants.items():
        assert torch.allclose(lp, lp_prefix, atol=1e-5), name
        assert len(grads) == len(g_prefix)
        for a, b in zip(grads, g_prefix):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), name


def test_no_grad_head_chunks_and_sampled_entropy_agree_with_the_full_computation(host, monkeypatch):
    samples = samples_for(host)
    batch = make_batch(samples, host.tokenizer.pad_token_id, layout="prefix")
    with torch.no_grad():
        lp_full, ent_full, _ = training.Learner(host).completion_forward(host.core, batch, want_entropy=True)
        lp, ent, _ = training.Learner(host, head_chunk=5, entropy_rows=3).completion_forward(host.core, batch)
    m = batch.token_mask > 0
    assert torch.allclose(lp[m], lp_full[m], atol=1e-5)
    measured = ~torch.isnan(ent)
    assert 0 < int(measured.sum()) < int(m.sum())  # a sample: 3 tokens per chunk of 5
    assert torch.allclose(ent[measured], ent_full[measured], atol=1e-5)
    assert not torch.isnan(ent_full[m]).any()


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_token_budgets_bound_every_micro_batch(layout):
    samples = [Sample(f"c{i}", "p", [1] * (5 + i), [2] * (3 + (i * 7) % 11), [0.0], 1.0, {}) for i in range(30)]
    chunks = micro_batches(samples, 4, layout=layout, token_budget=64)
    assert sorted(s.call_id for c in chunks for s in c) == sorted(s.call_id for s in samples)
    for c in chunks:
        cost = sum(s.length for s in c) if layout == "packed" else len(c) * max(s.length for s in c)
        assert cost <= 64 or len(c) == 1
    by_count = micro_batches(samples, 4, layout=layout)
    assert max(len(c) for c in by_count) == 4 and sum(len(c) for c in by_count) == 30


def test_truncated_importance_sampling_weights_are_one_on_policy(host):
    """With the rollout's own logprobs (same weights, fp32), the IS weights are 1 and the measured
    mismatch is float noise; with shifted rollout logprobs the weights show the shift, capped."""
    from masrl.config import SamplingParams
    from masrl.engines.hf import HFEngine
    from masrl.messages import GenRequest

    samples = samples_for(host, 4)
    eng = HFEngine(host.model, host.tokenizer, [2])
    outs = eng.generate([GenRequest(s.prompt_ids, SamplingParams(temperature=s.temperature, max_new_tokens=5))
                         for s in samples])
    for s, o in zip(samples, outs):
        s.completion_ids, s.logprobs = o.completion_ids, o.logprobs
    algo = AlgorithmConfig(tis_cap=2.0, group_key=["task_id"])
    opt = torch.optim.SGD(host.policy_parameters("p"), lr=0.0)
    opt.grads = lambda: host.policy_parameters("p")
    m = training.Learner(host, algo, host.tokenizer.pad_token_id).train("p", samples, opt, 1.0)
    assert m["lp_mismatch"] < 1e-4 and abs(m["tis_weight"] - 1.0) < 1e-4
    for s in samples:
        s.logprobs = [lp - 5.0 for lp in s.logprobs]  # the rollout engine "thought" these tokens were rare
        s.old_logprobs = None
    m = training.Learner(host, algo, host.tokenizer.pad_token_id).train("p", samples, opt, 1.0)
    assert m["lp_mismatch"] == pytest.approx(5.0, abs=1e-3) and m["tis_weight"] == pytest.approx(2.0)


def test_a_nonfinite_loss_skips_the_update_and_is_counted(host, capsys):
    samples = samples_for(host, 4)
    for s in samples:
        s.logprobs = [float("nan")] * len(s.completion_ids)  # a broken rollout: the ratio is NaN
    algo = AlgorithmConfig(group_key=["task_id"])
    before = [p.detach().clone() for p in host.policy_parameters("p")]
    from masrl.worker.model.precision import MasterWeightsAdamW

    opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    m = training.Learner(host, algo, host.tokenizer.pad_token_id).train("p", samples, opt, 1.0)
    assert m["nonfinite_skipped"] == 1 and m["optimizer_steps"] == 0
    assert all(torch.equal(a, b) for a, b in zip(before, host.policy_parameters("p")))
    assert "this optimizer step was skipped" in capsys.readouterr().err


def test_an_advantage_estimator_from_config(host, tmp_path):
    from masrl.config import load_config
    from masrl.errors import ConfigError

    samples = samples_for(host, 4)
    algo = AlgorithmConfig(advantage="helpers:centered_advantage", advantage_options={"scale": 2.0})
    training.compute_advantages(samples, algo)
    rewards = [s.reward for s in samples]
    mean = sum(rewards) / len(rewards)
    assert [s.advantage for s in samples] == pytest.approx([2.0 * (r - mean) for r in rewards])
    from masrl.driver.checks import check_run

    cfg = load_config(data={"policies": {"p": {}}, "agents": {"solver": {"policy": "p"}}, "workflow": {"name": "math_solver"},
                            "algorithm": {"advantage": "grpoo"}, "model": "tiny-random"})
    with pytest.raises(ConfigError, match="algorithm.advantage: unknown advantage estimator 'grpoo'"):
        check_run(cfg)  # the one validation step, before any model loads


def test_a_prefix_budget_counts_the_shared_prompt_once_and_keeps_a_calls_samples_together():
    """Eight samples of each of three 100-token prompts (one system prompt of 40 tokens, then a call's
    own 60): with a budget of 300 each call's eight run its prompt once (99 + 8 x rest); the padded layout
    at the same budget fits 2 rows a chunk, so 12 chunks run the prompt 24 times."""
    system = list(range(100, 140))
    prompts = [system + [1000 + c] * 60 for c in range(3)]
    samples = [Sample(f"c{c}-{i}", "p", list(prompts[c]), [2] * (3 + i % 4), [0.0], 1.0, {})
               for i in range(8) for c in range(3)]  # interleaved: calls' samples arrive mixed
    chunks = micro_batches(samples, 4, layout="prefix", token_budget=300)
    assert sorted(s.call_id for c in chunks for s in c) == sorted(s.call_id for s in samples)
    assert [sorted({s.call_id[:2] for s in c}) for c in chunks] == [["c0"], ["c1"], ["c2"]]  # one call each
    assert all(prefix_cost(c) <= 300 for c in chunks) and prefix_cost(chunks[0]) == 99 + 8 * 7
    prefix_tokens = sum(prefix_cost(c) for c in chunks)
    padded = micro_batches(samples, 4, layout="padded", token_budget=300)
    padded_tokens = sum(len(c) * max(s.length for s in c) for c in padded)
    assert len(padded) == 12 and prefix_tokens * 3 < padded_tokens  # 465 tokens against 2,472
    # a tighter budget splits a call's samples (and never drops one); a row over the budget runs alone
    tight = micro_batches(samples, 4, layout="prefix", token_budget=120)
    assert all(prefix_cost(c) <= 120 or len(c) == 1 for c in tight) and sum(len(c) for c in tight) == 24
    assert len(tight[0]) == 4 and prefix_cost(tight[0]) == 99 + 4 * 5  # completions of 3, 3, 4, 4 tokens
    alone = micro_batches(samples[:2], 4, layout="prefix", token_budget=50)
    assert [len(c) for c in alone] == [1, 1]
    # rows that share only the system prompt still join while the cost allows it
    mixed = micro_batches([samples[0], samples[1], samples[2]], 4, layout="prefix", token_budget=10_000)
    assert len(mixed) == 1 and prefix_cost(mixed[0]) == 40 + 3 * (max(s.length for s in mixed[0]) - 40)


def test_share_prefix_wins_over_the_cuda_packing_default_and_both_at_once_is_refused(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(training.Learner, "packing_available", lambda self: True)  # as on a CUDA host with flash kernels
    gpu = SimpleNamespace(device=torch.device("cuda"), sharded=None)
    assert training.Learner(gpu, AlgorithmConfig()).layout() == "packed"
    assert training.Learner(gpu, AlgorithmConfig(share_prefix=True)).layout() == "prefix"
    assert training.Learner(gpu, AlgorithmConfig(pack=False)).layout() == "padded"
    cpu = SimpleNamespace(device=torch.device("cpu"), sharded=None)
    assert training.Learner(cpu, AlgorithmConfig()).layout() == "prefix"
    with pytest.raises(ValueError, match="pack and share_prefix"):
        AlgorithmConfig(pack=True, share_prefix=True)


def test_the_cuda_default_turns_to_the_shared_prefix_for_long_shared_prompts_only(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(training.Learner, "packing_available", lambda self: True)
    gpu = SimpleNamespace(device=torch.device("cuda"), sharded=None)

    def calls(prompt, completion, n_calls=3, samples=8):
        out = []
        for c in range(n_calls):
            p = [7 + c] + list(range(100, 100 + prompt - 1))
            out += [Sample(f"c{c}s{k}", "p", p, list(range(completion + k % 3)), [0.0] * (completion + k % 3), 1.0,
                           {"task_id": c}) for k in range(samples)]
        return out

    algo = AlgorithmConfig(micro_batch_tokens=8192)
    long_prompts = calls(2900, 20)  # a reading agent's 24 passages: 8 samples run the prompt once
    assert training.prefix_pays(long_prompts, algo)
    assert training.Learner(gpu, algo).layout(long_prompts) == "prefix"
    short_prompts = calls(200, 300)  # math: the answers are longer than the prompt
    assert not training.prefix_pays(short_prompts, algo)
    assert training.Learner(gpu, algo).layout(short_prompts) == "packed"
    # a setting given decides, whatever the samples
    assert training.Learner(gpu, AlgorithmConfig(share_prefix=False)).layout(long_prompts) == "packed"
    assert training.Learner(gpu, AlgorithmConfig(pack=True)).layout(long_prompts) == "packed"
    sharded = SimpleNamespace(device=torch.device("cuda"), sharded=object())
    assert training.Learner(sharded, algo).layout(long_prompts) == "packed"


def test_an_update_in_prefix_budget_chunks_equals_the_one_in_a_single_micro_batch(host):
    samples = samples_for(host, 6)
    for s in samples:  # on-policy: the ratio starts at 1
        s.logprobs = full_logprobs(host, s).tolist()
    start = [p.detach().clone() for p in host.policy_parameters("p")]

    def update(**algo_kw):
        with torch.no_grad():
            for p, s in zip(host.policy_parameters("p"), start):
                p.copy_(s)
        for s in samples:
            s.old_logprobs = None
        opt = torch.optim.SGD(host.policy_parameters("p"), lr=0.5)
        opt.grads = lambda: host.policy_parameters("p")
        algo = AlgorithmConfig(group_key=["task_id"], **algo_kw)
        training.Learner(host, algo, host.tokenizer.pad_token_id).train("p", samples, opt, 1.0)
        return [p.detach().clone() for p in host.policy_parameters("p")]

    whole = update(micro_batch_size=8)
    chunks = micro_batches(samples, 8, layout="prefix", token_budget=60)
    assert len(chunks) > 1 and any(len(c) > 1 for c in chunks)  # really split, and really shared
    split = update(micro_batch_tokens=60)
    moved = max((a - b).abs().max().item() for a, b in zip(whole, start))
    assert moved > 1e-4 and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(whole, split))
    with torch.no_grad():
        for p, s in zip(host.policy_parameters("p"), start):
            p.copy_(s)


def test_prefix_chunks_of_multi_turn_calls_group_by_length_when_that_runs_fewer_tokens():
    """A tool-calling agent's step: first turns (system + question) and second turns (that, the first
    completion and a tool result). Each episode's turns together pad the short rows to the long ones;
    first turns with first turns and second with second run fewer tokens, and are chosen."""
    from masrl.worker.updater.batching import _prefix_chunks

    system = list(range(10, 60))
    other = list(range(500, 550))  # another agent's system prompt on the same policy
    rows = []
    for q in range(4):
        first = system + [1000 + q] * 5
        for s in range(4):
            done = [2000 + 10 * q + s] * 6
            rows.append(Sample(f"q{q}s{s}t1", "p", list(first), done, [0.0], 1.0, {}))
            rows.append(Sample(f"q{q}s{s}t2", "p", first + done + [3000 + s] * 40, [4] * 6, [0.0], 1.0, {}))
    rows += [Sample(f"o{i}", "p", other + [7] * (3 + i), [5] * 4, [0.0], 1.0, {}) for i in range(3)]
    chunks = micro_batches(rows, 8, layout="prefix")
    assert sorted(s.call_id for c in chunks for s in c) == sorted(s.call_id for s in rows)
    assert all(len(c) <= 8 for c in chunks)
    assert all(len({s.prompt_ids[:16] == system[:16] for s in c}) == 1 for c in chunks)  # agents never mix
    turns = [{s.call_id[-2:] for s in c if s.call_id[0] == "q"} for c in chunks]
    assert sorted(map(sorted, turns)) == [[]] + [["t1"]] * 2 + [["t2"]] * 2  # by turn, not by episode
    by_episode = _prefix_chunks(rows, 8)
    assert sum(map(prefix_cost, chunks)) < 0.8 * sum(map(prefix_cost, by_episode))
    # one call's samples alone (a GRPO group of one prompt): the token-order grouping already runs fewest
    group = [Sample(f"g{i}", "p", system + [9] * 30, [6] * (2 + i), [0.0], 1.0, {}) for i in range(8)]
    assert sum(map(prefix_cost, micro_batches(group, 8, layout="prefix"))) == prefix_cost(group) == 79 + 8 * 10
    # under a token budget the same choice: fewer tokens than taking the rows in prompt order
    from masrl.worker.updater.batching import _budget_chunks

    budget = micro_batches(rows, 8, layout="prefix", token_budget=600)
    assert sorted(s.call_id for c in budget for s in c) == sorted(s.call_id for s in rows)
    assert all(prefix_cost(c) <= 600 or len(c) == 1 for c in budget)
    in_order = _budget_chunks(sorted(rows, key=lambda s: (s.prompt_ids, s.length)), 600, 16)
    assert sum(map(prefix_cost, budget)) < 0.8 * sum(map(prefix_cost, in_order))


def test_a_checkpointed_forward_decides_the_fused_ops_before_its_first_layer(host, monkeypatch):
    """On CUDA the fused ops' start-up check (a forward and backward of its own) runs at their first use. If that
    use is inside a checkpointed layer, the check's tensors count as the layer's saved tensors in the forward but
    not in the recompute, and torch refuses the backward (seen on an H100 with a 7B LoRA update). Here the check
    runs on a CPU through the same dispatch, with every op left to torch."""
    from masrl.modeling import fused

    ran = []

    def check(device):
        x = torch.randn(4, 4, requires_grad=True)
        torch.autograd.grad((x * x.sin()).sum(), [x])  # saves tensors, as the real check does
        ran.append(str(device))
        return {"rope": "off in this test", "swiglu": "off in this test", "token_logprobs": "off in this test"}

    monkeypatch.setattr(fused, "_VERDICT", {})
    monkeypatch.setattr(fused, "_can_fuse", lambda x: True)
    monkeypatch.setattr(fused, "check", check)
    samples = samples_for(host)
    lp, grads = logprobs_and_grads(host, samples, "padded", checkpoint=True)
    assert ran == ["cpu"]  # once, before the first layer
    monkeypatch.setattr(fused, "_can_fuse", lambda x: False)
    lp_ref, grads_ref = logprobs_and_grads(host, samples, "padded")
    assert torch.allclose(lp, lp_ref, atol=1e-5)
    for a, b in zip(grads, grads_ref):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def _lora_pair(tiny, dtype):
    """The tiny model with fp32 LoRA adapters on every projection (as the trainer holds them) on a ``dtype`` base."""
    import copy

    from peft import LoraConfig, get_peft_model

    model, _ = tiny
    base = copy.deepcopy(model).to(dtype).requires_grad_(False)
    cfg = LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = get_peft_model(base, cfg, adapter_name="p")
    torch.manual_seed(0)
    for n, p in pm.named_parameters():
        if "lora_" in n:
            p.data = p.data.float()
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.1)
    return pm


def _lean_and_peft(pm, ids):
    """Hidden states and adapter gradients from the lean forward, and the same from PEFT's own module forwards, with
    the tensors each keeps for backward (bytes, and the widest fp32 one)."""
    from masrl.modeling import lean

    fwd = lean.LlamaForward(pm)
    pos = torch.arange(ids.shape[1])[None]
    out = {}
    for name, proj in (("lean", None), ("peft", lambda self, mod, x, adapters: mod(x))):
        if proj is not None:
            fwd._proj = proj.__get__(fwd)
        kept: dict = {}

        def pack(t, kept=kept):
            kept.setdefault(t.untyped_storage().data_ptr(), t)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            h = fwd.hidden(ids, pos, None)
        h.float().pow(2).sum().backward()
        params = {p.untyped_storage().data_ptr() for p in pm.parameters()}
        rows = (ids.shape[0], ids.numel())  # [B, ...] or [B * S, ...]: activations, not the adapters' casts
        acts = [t for k, t in kept.items() if k not in params and t.dim() >= 2 and t.shape[0] in rows]
        grads = [p.grad.clone() for n, p in pm.named_parameters() if "lora_" in n]
        pm.zero_grad(set_to_none=True)
        out[name] = (h.detach(), grads, acts)
    return out["lean"], out["peft"]


def test_adapted_projections_match_peft_bit_for_bit_in_fp32(tiny):
    pm = _lora_pair(tiny, torch.float32)
    ids = torch.randint(3, 2000, (2, 12), generator=torch.Generator().manual_seed(1))
    (h, grads, _), (h_ref, grads_ref, _) = _lean_and_peft(pm, ids)
    assert torch.equal(h, h_ref)
    assert len(grads) == len(grads_ref) == 2 * 7 * len(pm.base_model.model.model.layers)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_ref))


def test_a_bf16_update_keeps_no_fp32_copy_of_an_adapted_projections_input(tiny):
    """PEFT casts each adapted projection's input to its fp32 adapter and keeps that copy for backward; the lean
    forward casts the small adapter instead, and keeps fewer bytes. Its numbers: one adapted projection in bf16,
    output and adapter gradients against the same projection computed in fp32, as close as PEFT's own."""
    from masrl.modeling.lean import lora_linear

    pm = _lora_pair(tiny, torch.bfloat16)
    ids = torch.randint(3, 2000, (2, 12), generator=torch.Generator().manual_seed(1))
    (_, _, acts), (_, _, acts_ref) = _lean_and_peft(pm, ids)
    width = pm.config.hidden_size
    assert any(t.dtype == torch.float32 and t.shape[-1] > width for t in acts_ref)  # PEFT's fp32 copies
    assert not any(t.dtype == torch.float32 and t.shape[-1] > width for t in acts)
    fp32_acts = lambda ts: sum(t.numel() for t in ts if t.dtype == torch.float32)  # noqa: E731
    assert fp32_acts(acts) < fp32_acts(acts_ref) / 2

    mod = pm.base_model.model.model.layers[0].mlp.down_proj
    x = torch.randn(24, mod.base_layer.in_features, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    g = torch.randn(24, mod.base_layer.out_features, generator=torch.Generator().manual_seed(3))
    a, b = mod.lora_A["p"].weight, mod.lora_B["p"].weight

    def run(fn, inp):
        a.grad = b.grad = None
        y = fn(inp)
        (y.float() * g).sum().backward()
        return y.float().detach(), a.grad.clone(), b.grad.clone()

    w = mod.base_layer.weight
    exact = run(lambda t: t @ w.float().t() + (t @ a.t()) @ b.t() * mod.scaling["p"], x.float())
    ours, theirs = run(lambda t: lora_linear(mod, t), x), run(mod, x)
    for got, ref, truth in zip(ours, theirs, exact):
        err, err_ref = (got - truth).norm() / truth.norm(), (ref - truth).norm() / truth.norm()
        assert got.dtype == torch.float32 and err < max(2 * err_ref, 1e-2), (err, err_ref)
