"""GPU tests: skipped without CUDA (CI has none); run them on a GPU host with
``source scripts/gpu/setup.sh && python3 -m pytest tests/gpu -m gpu -rA``."""

import asyncio
import copy
import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))  # tinycfg
sys.path.insert(0, os.path.join(ROOT, "tests"))  # helpers

from helpers import adapter_logprobs, full_logprobs, update_held_open  # noqa: E402


def req(prompt, temperature=1.0, max_new_tokens=8, adapter=None, seed=None, **kw):
    from masrl.config import SamplingParams
    from masrl.messages import GenRequest

    return GenRequest(list(prompt), SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, **kw),
                      adapter=adapter, seed=seed)


def prompts(tok, n, shared=True):
    sys_ = "You are a careful assistant. Answer with one number inside answer tags, please, always."
    return [tok(f"{sys_ if shared else ''} Question {i}: what is {i} plus {i * 3}?", add_special_tokens=False)["input_ids"]
            for i in range(n)]


def report(name, gaps):
    g = torch.tensor(gaps)
    print(f"[gpu] {name}: max |dlogp| {g.max():.2e}, mean {g.mean():.2e} over {len(g)} tokens")
    return g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_engine_logprobs_match_a_full_forward_on_gpu(dtype):
    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=dtype, device="cuda")
    eng = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", sync_every=4)
    ps = prompts(tok, 6) + prompts(tok, 3, shared=False)
    reqs = [req(p, temperature=t, max_new_tokens=n) for p, t, n in zip(ps, [1.0, 0.7, 0.0] * 3, [5, 17, 9, 33, 3, 12, 8, 40, 2])]
    outs = eng.generate(reqs)
    assert eng.stats["graphs_captured"] > 0
    gaps = []
    for r, o in zip(reqs, outs):
        assert len(o.completion_ids) == r.max_new_tokens
        ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        gaps += (ref - torch.tensor(o.logprobs)).abs().tolist()
    g = report(f"paged engine vs HF forward, {dtype}", gaps)
    if dtype == torch.float32:
        assert g.max() < 2e-3
    else:
        assert g.mean() < 0.05 and g.max() < 0.5
    # graphs replayed against a second batch give the same greedy tokens as the eager engine
    from masrl.engines.hf import HFEngine

    if dtype == torch.float32:
        greedy = [req(p, temperature=0.0, max_new_tokens=4 + 5 * i) for i, p in enumerate(ps)]
        a = eng.generate(greedy)
        b = HFEngine(model, tok, [tok.eos_token_id]).generate(greedy)
        assert [o.completion_ids for o in a] == [o.completion_ids for o in b]


def test_engine_buffers_grow_and_graphs_recapture_across_batch_sizes():
    """Batch 1, then 16 (the buffers grow and every graph is recaptured), then 3 (graphs reused)."""
    from masrl.engines.hf import HFEngine
    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.float32, device="cuda")
    eng = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0")
    eager = HFEngine(model, tok, [tok.eos_token_id])
    for n in (1, 16, 3):
        reqs = [req(p, temperature=0.0, max_new_tokens=6 + i) for i, p in enumerate(prompts(tok, n))]
        assert [o.completion_ids for o in eng.generate(reqs)] == [o.completion_ids for o in eager.generate(reqs)]
    print(f"[gpu] engine stats after batches 1, 16, 3: {eng.stats}")


def two_adapter_model():
    """SmolLM2-135M's shape in fp32 on the GPU with LoRA adapters "a" and "b" (B matrices not zero)."""
    from peft import LoraConfig, get_peft_model

    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.float32, device="cuda")
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                          "down_proj"], task_type="CAUSAL_LM")
    pm = get_peft_model(model, cfg, adapter_name="a")
    pm.add_adapter("b", cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)
    pm.eval()
    return pm, tok


def test_lora_mixed_adapter_batch_equals_per_adapter_runs_on_gpu():
    from masrl.engines.paged import PagedEngine

    pm, tok = two_adapter_model()
    ps = prompts(tok, 8)
    adapters = ["a", "b", None, "a", "b", "b", "a", None]
    reqs = [req(p, temperature=0.0, max_new_tokens=12, adapter=a) for p, a in zip(ps, adapters)]
    mixed = PagedEngine(pm, tok, [tok.eos_token_id], device="cuda:0").generate(reqs)
    gaps = []
    for r, m in zip(reqs, mixed):
        alone = PagedEngine(pm, tok, [tok.eos_token_id], device="cuda:0").generate([r])[0]
        assert alone.completion_ids == m.completion_ids
        ref = adapter_logprobs(pm, r.adapter, r.prompt_ids, m.completion_ids)
        gaps += (ref - torch.tensor(m.logprobs)).abs().tolist()
    assert report("LoRA mixed batch vs per-adapter HF forward, fp32", gaps).max() < 2e-3


def test_a_masked_grouped_query_attention_runs_a_fused_kernel_on_gpu():
    """``lean.masked_attention`` (a prefill over cached blocks, the prefix layout) must not need SDPA's math
    kernel, which holds [B, H, S, K] fp32 scores: with only the memory-efficient kernel allowed it runs, and
    agrees with an fp32 reference. Whether SDPA alone could (mask + ``enable_gqa``) is printed."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from masrl.modeling import lean

    g = torch.Generator(device="cuda").manual_seed(0)
    B, H, KV, S, K, D = 2, 14, 2, 256, 1000, 64
    q = torch.randn(B, H, S, D, generator=g, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(B, KV, K, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    valid = torch.ones(B, K, dtype=torch.bool, device="cuda")
    valid[1, :100] = False  # a row whose cached past starts later
    mask = lean.causal_mask(valid, K - S, S)
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):  # no math kernel to fall to
        o = lean.masked_attention(q, k, v, mask, D**-0.5, True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, enable_gqa=True)
    err = (o.float() - ref).abs().max().item()
    try:
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        alone = "runs"
    except RuntimeError:
        alone = "has no fused kernel"
    print(f"[gpu] masked GQA attention: max |err| vs fp32 {err:.2e}; SDPA with mask + enable_gqa alone {alone}")
    assert err < 2e-2


def test_packed_layout_matches_padded_on_gpu():
    from masrl.config import OptimConfig
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel
    from masrl.worker.updater import training
    from masrl.worker.updater.batching import Sample, make_batch

    host = HeldModel("random-smollm2-135m", [PolicySpec("p", "random-smollm2-135m", optim=OptimConfig())],
                     device="cuda:0", dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    samples = []
    for i, p in enumerate(prompts(host.tokenizer, 6) + prompts(host.tokenizer, 2, shared=False)):
        c = torch.randint(3, 40000, (5 + 9 * i,), generator=g).tolist()
        samples.append(Sample(f"c{i}", "p", p, c, [0.0] * len(c), 1.0, {}))
    out = {}
    for layout in ("padded", "packed", "prefix"):
        host.model.zero_grad(set_to_none=True)
        batch = make_batch(samples, 2, layout=layout, device=host.device)
        lp, _, _ = training.Learner(host).completion_forward(host.core, batch)
        (lp * batch.token_mask).sum().backward()
        grad = torch.cat([p.grad.float().flatten() for p in host.model.parameters() if p.grad is not None])
        out[layout] = (lp.detach().float(), grad)
    for layout in ("packed", "prefix"):
        dl = (out[layout][0] - out["padded"][0]).abs().max().item()
        ga, gb = out[layout][1], out["padded"][1]
        rel = ((ga - gb).norm() / gb.norm()).item()
        print(f"[gpu] {layout} vs padded (bf16): max |dlogp| {dl:.2e}, relative grad difference {rel:.2e}")
        assert dl < 0.1 and rel < 0.05
    from masrl.config import AlgorithmConfig

    assert training.Learner(host, AlgorithmConfig()).layout() == "packed"
    # 8 samples of one long prompt with short answers: the default turns to the shared prefix on a real
    # CUDA host too (packing_available is true there), and the prefix layout agrees with packing
    long_prompt = prompts(host.tokenizer, 1)[0] * 40
    group = [Sample(f"g{k}", "p", long_prompt, [100 + k, 200, 300], [0.0] * 3, 1.0, {}) for k in range(8)]
    assert training.Learner(host).packing_available()
    assert training.Learner(host, AlgorithmConfig(micro_batch_tokens=8192)).layout(group) == "prefix"
    lps = {}
    for layout in ("packed", "prefix"):
        batch = make_batch(group, 2, layout=layout, device=host.device)
        with torch.no_grad():
            lps[layout] = training.Learner(host).completion_forward(host.core, batch)[0].float()
    assert (lps["packed"] - lps["prefix"]).abs().max().item() < 0.1


def _train(tmp_path, device, precision, steps=2, temperature=0.0, **extra):
    from tinycfg import tiny_config

    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    data = tiny_config("math/team_shared", tmp_path / f"{device}-{precision}", steps=steps, hash_agents=None)
    data.update(device=device, precision=precision, seed=0)
    for a in data["agents"].values():
        a["temperature"] = temperature  # greedy: CPU and GPU sample the same tokens, so their updates compare
    data["rollout"].update(samples_per_task=1, tasks_per_step=4)
    data["algorithm"].update(group_key=["agent"])  # groups across tasks: greedy samples still differ
    data["policies"]["shared"]["optim"] = {"lr": 1e-3}
    data["rewards"] = [{"type": "outcome"}, {"type": "helpers:task_hash_reward"}]
    data.update(extra)
    tr = Trainer(load_config(data=data), run_dir=tmp_path / f"{device}-{precision}")
    tr.prepare(resume=False)
    w = tr.rt.workers[0]
    before = w.fingerprint("shared")
    recs = [asyncio.run(tr.train_step()) for _ in range(steps)]
    after = w.fingerprint("shared")
    tr.save_checkpoint()
    asyncio.run(tr.rt.controller.aclose())
    return tr, recs, before, after


def test_two_training_steps_on_cuda_move_reward_and_loss_like_the_cpu_run(tmp_path):
    runs = {key: _train(tmp_path, *key) for key in [("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16")]}
    for key, (_tr, recs, before, after) in runs.items():
        p = recs[0]["policies"]["shared"]
        print(f"[gpu] {key}: step rewards {[round(r['rollout']['reward'], 4) for r in recs]}, losses "
              f"{[round(r['policies']['shared']['loss'], 5) for r in recs]}, grad norm {p['grad_norm']:.4f}, "
              f"lp mismatch mean {p['lp_mismatch']:.2e} max {p['lp_mismatch_max']:.2e}")
        assert after != before and p["optimizer_steps"] >= 1 and p["grad_norm"] > 0
    cpu, gpu = runs[("cpu", "fp32")][1], runs[("cuda", "fp32")][1]
    assert cpu[0]["rollout"]["reward"] == pytest.approx(gpu[0]["rollout"]["reward"], abs=1e-6)
    assert cpu[0]["policies"]["shared"]["loss"] == pytest.approx(gpu[0]["policies"]["shared"]["loss"], rel=1e-3, abs=1e-5)
    assert cpu[1]["policies"]["shared"]["loss"] == pytest.approx(gpu[1]["policies"]["shared"]["loss"], rel=5e-2, abs=1e-4)
    # the same weights (drawn on the CPU), the same tokens: the same gradient, whatever the layout
    assert cpu[0]["policies"]["shared"]["grad_norm"] == pytest.approx(gpu[0]["policies"]["shared"]["grad_norm"], rel=1e-2)


def test_checkpoint_saved_on_gpu_loads_on_cpu_and_generates_the_same_greedy_text(tmp_path):
    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    tr, _, _, _ = _train(tmp_path, "cuda", "fp32", steps=1)
    ckpt_dir = tr.ckpt_root / "step_000001"
    cfg_cpu = load_config(data=dict(copy.deepcopy(tr.cfg.model_dump(mode="json")), device="cpu",
                                    output_dir=str(tmp_path / "cpu-load")))
    cpu = Trainer(cfg_cpu, run_dir=tmp_path / "cpu-load")
    from masrl.driver.builder import build_runtime

    cpu.rt = build_runtime(cfg_cpu, log=lambda *_: None)
    cpu.load_checkpoint(ckpt_dir)
    g, c = tr.rt.workers[0], cpu.rt.workers[0]
    for a, b in zip(g.held.model.state_dict().values(), c.held.model.state_dict().values()):
        assert torch.equal(a.cpu(), b)
    tok = g.held.tokenizer
    reqs = [req(p, temperature=0.0, max_new_tokens=20) for p in prompts(tok, 4)]
    out_g = g.sampler.engine.generate(reqs)
    out_c = c.sampler.engine.generate(reqs)
    assert [o.text for o in out_g] == [o.text for o in out_c]
    # the optimizer state came along too, onto the CPU
    st = c.updater.optimizers["shared"].state_dict()["adamw"]["state"]
    assert st and all(v.device.type == "cpu" for s in st.values() for v in s.values() if torch.is_tensor(v) and v.dim())


def test_cli_trains_the_lora_team_on_cuda(tmp_path):
    cmd = [sys.executable, "-m", "masrl.cli", "train", "math/team_lora", "device=cuda",
           "model=random-smollm2-135m", "train.steps=2", "train.eval_before=false", "train.eval_after=false",
           "data.train.n=40", "rollout.tasks_per_step=4", "rollout.samples_per_task=4",
           "rewards=[{type: outcome}, {type: format, weight: 0.5}, {type: 'helpers:agent_hash_reward'}]",
           f"output_dir={tmp_path / 'run'}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    print(out.stdout[-2000:], out.stderr[-2000:])
    assert out.returncode == 0
    assert "step 2/2" in out.stdout and "on cuda:0" in out.stdout
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "solver" / "adapter.safetensors").is_file()


def test_optimizer_offload_gives_the_same_weights_and_frees_gpu_memory(tmp_path):
    """bf16 with fp32 masters: moving masters and AdamW state to pinned CPU memory between updates
    and back changes no number, and between updates the GPU holds none of it."""
    runs = {}
    for off in (False, True):
        extra = {"policies": {"shared": {"optim": {"lr": 1e-3}, "offload_optimizer": off}}}
        tr, recs, before, after = _train(tmp_path / str(off), "cuda", "bf16", steps=2, **extra)
        opt = tr.rt.workers[0].updater.optimizers["shared"]
        devices = {t.device.type for t in opt._tensors()}
        runs[off] = (after, recs, devices)
    (a0, r0, d0), (a1, r1, d1) = runs[False], runs[True]
    print(f"[gpu] offload: weights {a1} vs {a0}; state devices {d1} vs {d0}; "
          f"moved {r1[1]['policies']['shared']['offload_gb']:.4f} GB in {r1[1]['policies']['shared']['offload_s']:.4f}s")
    assert a1 == a0 and [r["policies"]["shared"]["loss"] for r in r1] == [r["policies"]["shared"]["loss"] for r in r0]
    assert d0 == {"cuda"} and d1 == {"cpu"}
    assert r1[1]["policies"]["shared"]["offload_gb"] > 0


def test_two_model_families_train_a_step_on_cuda(tmp_path):
    from tinycfg import prepared_trainer, tiny_config

    data = tiny_config("math/team_two_policies", tmp_path, steps=1)
    data["policies"]["writer"]["model"] = "tiny-random-qwen2"
    data.update(device="cuda")
    tr, workers, before = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    print(f"[gpu] mixed families: {[type(w.held.core).__name__ for w in workers.values()]}, "
          f"losses {[round(m['loss'], 5) for m in rec['policies'].values()]}")
    assert rec["rollout"]["failed"] == 0 and set(rec["policies"]) == {"reasoner", "writer"}
    assert all(w.fingerprint(p) != before[p] for p, w in workers.items())


def test_reference_offload_gives_the_same_kl_and_weights(tmp_path):
    """With kl_coef > 0, a reference model kept in CPU memory between updates gives the same KL,
    losses and weights as one kept on the GPU."""
    runs = {}
    for off in (False, True):
        extra = {"policies": {"shared": {"optim": {"lr": 1e-3}, "offload_reference": off}},
                 "algorithm": {"micro_batch_size": 4, "kl_coef": 0.05, "group_key": ["agent"]}}
        # sampled, not greedy: a greedy token's logprob is 0 under any weights, so its KL is 0 too
        tr, recs, before, after = _train(tmp_path / str(off), "cuda", "bf16", steps=2, temperature=1.0, **extra)
        ref_dev = next(tr.rt.workers[0].held.reference.parameters()).device.type
        runs[off] = (after, recs, ref_dev)
    (a0, r0, d0), (a1, r1, d1) = runs[False], runs[True]
    kls = [[r["policies"]["shared"]["kl"] for r in rs] for rs in (r0, r1)]
    print(f"[gpu] reference offload: kl {kls[1]} vs {kls[0]}; reference on {d1} vs {d0}; "
          f"moving it {r1[1]['policies']['shared']['reference_offload_s']:.4f}s")
    assert a1 == a0 and kls[0] == kls[1] and d0 == "cuda" and d1 == "cpu"
    assert kls[0][1] != 0  # the second update's policy has moved away from its reference


def test_weight_offload_parks_idle_policies_and_changes_no_number(tmp_path):
    """Two full policies (one with an EMA), the paged engine with CUDA graphs, bf16: with
    offload_weights each policy's weights wait in pinned CPU memory except while it generates or
    updates; the losses and weights are those of the run that keeps everything on the GPU, and
    while one policy updates the other's weights hold no GPU memory."""
    import gc

    from tinycfg import prepared_trainer, tiny_config

    runs = {}
    for off in (False, True):
        gc.collect()
        base_mem = torch.cuda.memory_allocated()
        data = tiny_config("math/team_two_policies", tmp_path / str(off), steps=2, rollout__engine="paged")
        data.update(device="cuda", precision="bf16", seed=0)
        for a in data["agents"].values():
            a["temperature"] = 0.0
        data["algorithm"].update(group_key=["agent"])
        data["rewards"] = [{"type": "outcome"}, {"type": "helpers:task_hash_reward"}]
        for p in data["policies"].values():
            p.update(optim={"lr": 1e-3}, offload_weights=off)
        data["policies"]["writer"]["schedule"] = {"ema": 0.5}
        tr, workers, before = prepared_trainer(data, tmp_path / str(off))
        seen = {}
        orig = workers["reasoner"].train_step

        # where is the writer meanwhile?
        def spy(shared=None, _orig=orig, _seen=seen, _writer=workers["writer"], base_mem=base_mem, **kw):
            _seen["writer_device"] = next(_writer.held.model.parameters()).device.type
            _seen["mem"] = torch.cuda.memory_allocated() - base_mem
            return _orig(shared, **kw)

        workers["reasoner"].train_step = spy
        recs = [asyncio.run(tr.train_step()) for _ in range(2)]
        mem_after = seen.pop("mem")
        devices = {p: next(w.held.model.parameters()).device.type for p, w in workers.items()}
        after = {p: w.fingerprint(p) for p, w in workers.items()}
        res = asyncio.run(tr.evaluate("eval"))  # the EMA swaps in and out of parked weights
        runs[off] = dict(recs=recs, after=after, devices=devices, seen=seen, mem=mem_after, eval=res["outcome"],
                         stats=workers["reasoner"].sampler.engine.stats)
        asyncio.run(tr.rt.controller.aclose())
        del tr, workers
        torch.cuda.empty_cache()
    a, b = runs[False], runs[True]
    pol = b["recs"][1]["policies"]
    print(f"[gpu] weight offload: losses {[round(m['loss'], 6) for r in b['recs'] for m in r['policies'].values()]} "
          f"vs {[round(m['loss'], 6) for r in a['recs'] for m in r['policies'].values()]}; devices after update "
          f"{b['devices']} vs {a['devices']}; writer during reasoner's update: {b['seen']} vs {a['seen']}; "
          f"moved {pol['reasoner']['weights_offload_gb']:.4f} GB in {pol['reasoner']['weights_offload_s']:.4f}s; "
          f"engine {b['stats']['releases']} releases, {b['stats']['graphs_captured']} graphs captured vs "
          f"{a['stats']['graphs_captured']}; this run's GPU memory as the reasoner's update starts {b['mem'] / 2**20:.1f} MiB "
          f"vs {a['mem'] / 2**20:.1f}")
    assert b["after"] == a["after"] and b["eval"] == a["eval"]
    assert [m["loss"] for r in b["recs"] for m in r["policies"].values()] == \
        [m["loss"] for r in a["recs"] for m in r["policies"].values()]
    assert a["devices"] == {"reasoner": "cuda", "writer": "cuda"} and b["devices"] == {"reasoner": "cpu", "writer": "cpu"}
    assert a["seen"]["writer_device"] == "cuda" and b["seen"]["writer_device"] == "cpu"
    assert pol["reasoner"]["weights_offload_gb"] > 0 and b["stats"]["releases"] >= 2
    assert b["mem"] < a["mem"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_ray_places_two_policies_on_two_gpus_and_a_sharded_nccl_policy_matches_one_gpu(tmp_path):
    """placement: ray on a two-GPU host: two policies in two actors (one GPU each) train a step
    like one process on one GPU; a data-parallel policy on two GPUs (NCCL gradients, ZeRO-1 shards)
    ends its step at the one-GPU weights. Tiny model in fp32, so numbers can be compared."""
    pytest.importorskip("ray")
    from tinycfg import prepared_trainer, tiny_config

    def run(name, config, placement, **policy):
        data = tiny_config(config, tmp_path / name, steps=1, threads=1, seed=0)
        data.update(device="cuda", precision="fp32")
        data["runtime"] = {"placement": placement, "address": "local"}
        for p in data["policies"].values():
            p.update(policy)
        tr, workers, before = prepared_trainer(data, tmp_path / name)
        try:
            rec = asyncio.run(tr.train_step())
            after = {p: w.fingerprint(p) for p, w in workers.items()}
            asyncio.run(tr.rt.controller.aclose())
        finally:
            tr.rt.close()
        return rec, before, after

    out = {"two local": run("two_local", "math/team_two_policies", "local"),
           "two ray": run("two_ray", "math/team_two_policies", "ray", num_gpus=1),
           "one local": run("one_local", "math/team_shared", "local"),
           "one dp2": run("one_dp2", "math/team_shared", "ray", num_gpus=1, data_parallel=2, shard_optimizer=True)}
    for name, (rec, _, after) in out.items():
        pol = {p: (round(m["loss"], 6), round(m.get("gpu_peak_gb", 0), 3), round(m["optimizer_state_gb"], 4))
               for p, m in rec["policies"].items()}
        print(f"[gpu] ray {name}: reward {rec['rollout']['reward']:.4f}, (loss, peak GB, AdamW GB) {pol}, "
              f"transfer {rec.get('transfer')}, weights {after}")
    for local, ray_ in (("two local", "two ray"), ("one local", "one dp2")):
        (lr, lb, la), (rr, rb, ra) = out[local], out[ray_]
        assert rb == lb and ra != rb
        assert rr["rollout"]["reward"] == pytest.approx(lr["rollout"]["reward"], abs=1e-6)
        for p in la:
            assert ra[p] == pytest.approx(la[p], rel=1e-5)
        assert all(m["gpu_peak_gb"] > 0 for m in rr["policies"].values())  # the actors ran on GPUs
    assert out["one dp2"][0]["policies"]["shared"]["optimizer_state_gb"] < \
        out["one local"][0]["policies"]["shared"]["optimizer_state_gb"]


def test_overlap_update_on_cuda_samples_the_copy_and_publishes_exact_weights(tmp_path):
    """rollout.overlap_update on CUDA: the update runs on its own stream while the paged engine keeps sampling
    from its copy (old version); after the publish the copy equals the live weights bit for bit and the next
    calls' engine logprobs agree with the trainer's as closely as without a copy."""

    from tinycfg import prepared_trainer, tiny_config

    from masrl.config import SamplingParams
    from masrl.messages import GenCall

    data = tiny_config("math/team_shared", tmp_path, model="random-smollm2-135m", device="cuda", precision="bf16")
    data["rollout"].update(mode="async", overlap_update="auto", engine="auto")
    tr, workers, _ = prepared_trainer(data, tmp_path)
    w = workers["shared"]
    assert w.overlaps_update and w.sampler.copy.stream is not None and type(w.sampler.engine).__name__ == "PagedEngine"

    def sample(i, n=16):
        calls = [GenCall(f"c{i}-{k}", "shared", [{"role": "user", "content": f"What is {k} + {i}?"}],
                         SamplingParams(temperature=1.0, max_new_tokens=24, stop=[]), seed=k,
                         key={"task_id": f"t{k % 4}", "agent": "solver", "turn": 0}) for k in range(n)]
        return w.generate(calls)

    for r in sample(0):
        w.sampler.buffer[r.call_id].reward = float(hash(r.text) % 7)
    with update_held_open(w, timeout_s=300) as got:
        during = sample(1)  # the engine is not held back by the update, and samples the old weights
    assert {r.version for r in during} == {0}
    live = dict(w.held.model.named_parameters())
    assert all(torch.equal(p, live[n]) for n, p in w.sampler.copy.model.named_parameters())
    after = sample(2)
    assert {r.version for r in after} == {1}
    w.drop([r.call_id for r in during])  # sampled by version 0: their gap would include the update itself
    for r in after:
        w.sampler.buffer[r.call_id].reward = float(hash(r.text) % 7)
    m = w.train_step()["shared"]
    print(f"[gpu] overlap: engine/trainer logprob gap, first update {got['m']['shared']['lp_mismatch']:.2e}, second "
          f"(calls sampled after the publish) mean {m['lp_mismatch']:.2e} max {m['lp_mismatch_max']:.2e}")
    assert m["staleness_max"] == 0 and m["n_seqs"] == 16
    assert m["lp_mismatch"] < 5 * max(got["m"]["shared"]["lp_mismatch"], 1e-3)
    tr.rt.close()


def lora_async_samples_the_version_it_claims(tmp_path, engine: str, **rollout):
    """math/team_lora (four adapters on one frozen base) in async mode on ``engine``: after three updates every
    adapter's published version is its update count and the engine holds nothing stale; the trained calls carry
    versions past 0 (sampled after a publish); fresh calls' engine logprobs match the live adapters and not the
    starting ones (a sampler kept on the old policy fails here); an adapter changed without a publish is named stale."""
    from tinycfg import prepared_trainer, run_async, tiny_config

    data = tiny_config("math/team_lora", tmp_path, steps=3, model="random-smollm2-135m", device="cuda",
                       precision="bf16")
    for p in data["policies"].values():
        p["optim"] = {"lr": 1e-2}  # each update moves the adapters far enough for the logprobs to tell versions apart
    data["rollout"].update(mode="async", engine=engine, tasks_per_step=4, samples_per_task=4, **rollout)
    data["algorithm"]["skip_zero_advantage"] = False
    tr, workers, _ = prepared_trainer(data, tmp_path)
    w = next(iter(workers.values()))
    eng = w.sampler.engine
    assert type(eng).__name__ == {"paged": "PagedEngine", "vllm": "VLLMEngine"}[engine] and len(workers) == 4
    recs, traces = run_async(tr, 3)
    versions = sorted({c.policy_version for t in traces for c in t.calls})
    print(f"[gpu] {engine} LoRA async: versions of the trained calls {versions}, published {w.sampler.published}, "
          f"updates {w.updater.updates}")
    assert all(w.sampler.published[p] == w.updater.updates[p] >= 1 for p in workers)
    assert eng.stale_weights() == [] and max(versions) >= 1

    tok = w.held.tokenizer
    reqs = [req(ids, temperature=1.0, max_new_tokens=16, adapter=p, seed=i)
            for i, (ids, p) in enumerate(zip(prompts(tok, 8), list(workers) * 2))]
    outs = eng.generate(reqs)
    live, start = [], []
    for r, o in zip(reqs, outs):
        got = torch.tensor(o.logprobs)
        live += (adapter_logprobs(w.held.model, r.adapter, r.prompt_ids, o.completion_ids, 1.0) - got).abs().tolist()
        start += (adapter_logprobs(w.held.model, None, r.prompt_ids, o.completion_ids, 1.0) - got).abs().tolist()
    live, start = report(f"{engine} vs the live adapters", live), report(f"{engine} vs the starting adapters", start)
    assert live.mean() < 0.05 and start.mean() > 3 * live.mean()

    with torch.no_grad():  # the solver's adapter changes and is not published
        for n, prm in w.held.model.named_parameters():
            if "lora_B" in n and ".solver." in n:
                prm.add_(0.01)
    assert any("solver" in s for s in eng.stale_weights())
    w.sampler.publish(["solver"], {"solver": w.updater.updates["solver"]})
    assert eng.stale_weights() == []
    tr.rt.close()


def test_lora_async_on_the_paged_engine_samples_the_version_it_claims(tmp_path):
    lora_async_samples_the_version_it_claims(tmp_path, "paged")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_rollout_device_samples_on_the_second_gpu_and_trains_on_the_first(tmp_path):
    """policies.X.rollout_device: the engine and its copy of the weights live on cuda:1, the model and
    optimizer on cuda:0; after each update the copy equals the trained weights, the engine's logprobs
    agree with the trainer's, and in async mode calls are sampled while the update runs."""
    from tinycfg import prepared_trainer, tiny_config


    data = tiny_config("math/team_shared", tmp_path, steps=3, model="random-smollm2-135m", device="cuda:0",
                       precision="bf16", policies__shared__rollout_device="cuda:1")
    data["rollout"].update(mode="async", tasks_per_step=4, samples_per_task=4)
    tr, workers, before = prepared_trainer(data, tmp_path)
    w = workers["shared"]
    assert w.overlaps_update and str(next(w.sampler.copy.model.parameters()).device) == "cuda:1"
    assert str(next(w.held.model.parameters()).device) == "cuda:0"

    async def go():
        rollouts = tr.async_rollouts()
        recs = [await tr.async_step(rollouts) for _ in range(3)]
        await rollouts.stop()
        await tr.rt.controller.aclose()
        return recs

    recs = asyncio.run(go())
    live = dict(w.held.model.named_parameters())
    assert all(torch.equal(p.cpu(), live[n].cpu()) for n, p in w.sampler.copy.model.named_parameters())
    gaps = [r["policies"]["shared"]["lp_mismatch"] for r in recs]
    print(f"[gpu] rollout on cuda:1, training on cuda:0: calls during updates "
          f"{[r['async']['calls_during_update'] for r in recs]}, lp mismatch {['%.2e' % g for g in gaps]}, "
          f"staleness {[r['policies']['shared']['staleness_mean'] for r in recs]}")
    assert sum(r["async"]["calls_during_update"] for r in recs) > 0
    assert recs[0]["policies"]["shared"]["lp_mismatch"] < 2e-2  # version-0 calls scored by version-0 weights
    assert w.fingerprint("shared") != before["shared"]
    tr.rt.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_paged_engine_on_cuda0_captures_after_one_on_cuda1_was_deleted():
    """torch.cuda.graph's default capture stream is made once per process, on the device current at the
    first capture; an engine names its own device's stream, so the order engines are built in is free."""
    import gc

    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    outs = []
    for dev in ("cuda:1", "cuda:0"):
        model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.bfloat16, device=dev)
        eng = PagedEngine(model, tok, [tok.eos_token_id], device=dev)
        outs.append([o.completion_ids for o in eng.generate([req(p, temperature=0.0) for p in prompts(tok, 3)])])
        assert eng.stats["graphs_captured"] > 0
        del eng, model
        gc.collect()
    assert outs[0] == outs[1]  # greedy on the same weights: the same tokens on either GPU


def test_each_step_records_its_gpu_peak_and_what_holds_the_memory(tmp_path):
    """metrics: gpu_peak_gib and per GPU the parts (weights, engine KV and weights, optimizer); the
    parts are what the tensors hold, and the step's peak holds at least them."""
    import asyncio

    from tinycfg import prepared_trainer, tiny_config

    data = tiny_config("math/team_shared", tmp_path, steps=2, model="random-smollm2-135m", device="cuda:0",
                       precision="bf16")
    tr, workers, _ = prepared_trainer(data, tmp_path)
    recs = [asyncio.run(tr.train_step()) for _ in range(2)]
    w = workers["shared"]
    n_params = sum(p.numel() for p in w.held.model.parameters())
    for rec in recs:
        m = rec["memory"]["cuda:0"]
        print(f"[gpu] memory: peak {m['peak_gib']:.3f} GiB, reserved {m['reserved_gib']:.3f}, weights {m['weights']:.3f}, "
              f"kv {m['engine_kv']:.3f}, engine weights {m['engine_weights']:.3f}, optimizer {m['optimizer']:.3f}")
        assert rec["gpu_peak_gib"] == m["peak_gib"] and m["reserved_gib"] >= m["peak_gib"]
        assert abs(m["weights"] * 2**30 - 2 * n_params) < 0.05 * 2 * n_params  # bf16
        assert abs(m["optimizer"] * 2**30 - 12 * n_params) < 0.05 * 12 * n_params  # fp32 masters + two moments
        assert m["engine_kv"] > 0 and m["engine_weights"] > 0
        held = sum(m[k] for k in ("weights", "optimizer", "engine_kv", "engine_weights"))
        assert m["peak_gib"] >= held
    tr.rt.close()


def test_two_paged_engines_in_threads_capture_and_sample_at_once():
    """Two policies in one process (independent players, a frozen opponent): each engine samples in a thread of its
    own, and both capture their first graphs at the same moment. Each gives the greedy tokens it gives alone."""
    from concurrent.futures import ThreadPoolExecutor

    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    engines, batches = [], []
    for seed in (0, 1):
        model, tok = load_model("random-smollm2-135m", seed=seed, dtype=torch.bfloat16, device="cuda")
        engines.append(PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", max_batch_size=64))
        batches.append([req(p, temperature=0.0, max_new_tokens=12 + i % 5) for i, p in enumerate(prompts(tok, 24))])
    for _ in range(3):  # fresh graphs each round: a capture in one thread while the other captures or replays
        for e in engines:
            e.release()
        with ThreadPoolExecutor(2) as pool:
            together = list(pool.map(lambda k: engines[k].generate(batches[k]), (0, 1)))
        alone = [engines[k].generate(batches[k]) for k in (0, 1)]
        for k in (0, 1):
            assert [o.completion_ids for o in together[k]] == [o.completion_ids for o in alone[k]]
    assert all(e.stats["graphs_captured"] > 0 for e in engines)
    print(f"[gpu] two engines in threads: graphs captured {[e.stats['graphs_captured'] for e in engines]}")
