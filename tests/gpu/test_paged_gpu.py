"""The paged engine on a GPU: fused paged kernels agree with their torch versions, CUDA graphs keyed
by batch bucket serve any length, greedy tokens equal the eager engine's (fp32), bf16 logprobs match
a full forward, LoRA batches mix adapters, and a tight budget pre-empts without changing a token."""

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import adapter_logprobs, full_logprobs  # noqa: E402
from test_gpu import prompts, report, req, two_adapter_model  # noqa: E402


def forward_gaps(model, reqs, outs) -> list[float]:
    """|engine logprob - full forward's| for every token of every call."""
    gaps = []
    for r, o in zip(reqs, outs):
        ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        gaps += (ref - torch.tensor(o.logprobs)).abs().tolist()
    return gaps


@pytest.mark.parametrize("fused_rope", [False, True], ids=["two_kernels", "fused_rope"])
def test_paged_kernels_agree_and_greedy_equals_the_eager_engine(fused_rope):
    from masrl.engines.hf import HFEngine
    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.float32, device="cuda")
    eng = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", kv_blocks=512, fused_rope=fused_rope)
    assert {"paged_attention", "rope_and_cache_paged"} <= set(eng.stats["fused_kernels"])
    assert ("paged_rope_attention" in eng.stats["fused_kernels"]) == fused_rope
    ps = prompts(tok, 6) + prompts(tok, 3, shared=False)
    greedy = [req(p, temperature=0.0, max_new_tokens=4 + 9 * i) for i, p in enumerate(ps)]
    a = eng.generate(greedy)
    b = HFEngine(model, tok, [tok.eos_token_id]).generate(greedy)
    assert [o.completion_ids for o in a] == [o.completion_ids for o in b]
    assert eng.stats["graphs_captured"] >= 1 and all(k[1] == 0 for k in eng.runner.graphs)  # short rows: one graph a bucket
    tight = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", kv_blocks=12, fused_rope=fused_rope)
    c = tight.generate(greedy)
    assert tight.stats["preemptions"] > 0
    assert [o.completion_ids for o in c] == [o.completion_ids for o in b]
    print(f"[gpu] paged engine stats: {eng.stats}; tight budget: {tight.stats}")


@pytest.mark.parametrize("fused_rope", [False, True], ids=["two_kernels", "fused_rope"])
def test_paged_bf16_logprobs_and_a_lora_batch(fused_rope):
    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.bfloat16, device="cuda")
    eng = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", fused_rope=fused_rope)
    ps = prompts(tok, 6) + prompts(tok, 3, shared=False)
    reqs = [req(p, temperature=t, max_new_tokens=n) for p, t, n in zip(ps, [1.0, 0.7, 0.0] * 3, [5, 17, 9, 33, 3, 12, 8, 40, 2])]
    g = report("paged engine vs HF forward, bf16", forward_gaps(model, reqs, eng.generate(reqs)))
    assert g.mean() < 0.05 and g.max() < 0.5

    pm, tok = two_adapter_model()
    adapters = ["a", "b", None, "a", "b", "b", "a", None]
    reqs = [req(p, temperature=0.0, max_new_tokens=12, adapter=a) for p, a in zip(prompts(tok, 8), adapters)]
    mixed = PagedEngine(pm, tok, [tok.eos_token_id], device="cuda:0", fused_rope=fused_rope).generate(reqs)
    gaps = []
    for r, m in zip(reqs, mixed):
        ref = adapter_logprobs(pm, r.adapter, r.prompt_ids, m.completion_ids)
        gaps += (ref - torch.tensor(m.logprobs)).abs().tolist()
    assert report("paged LoRA mixed batch vs per-adapter HF forward, fp32", gaps).max() < 2e-3


def test_a_prefill_as_token_rows_equals_the_lean_forward_prefill(monkeypatch):
    """``graph_prefill``: first turns, a sampled group and next turns over their cached past prefilled as
    token rows of the decode graphs (16 rows a replay here, so calls span replays), against the lean
    forward's prefill (fp32): the same greedy tokens, each path's logprobs within 1e-3 of a full forward."""
    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.float32, device="cuda")
    rows = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", kv_blocks=512, graph_prefill=True,
                       prefill_rows=16)
    fwd = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", kv_blocks=512, graph_prefill=False)
    ps = prompts(tok, 6) + prompts(tok, 3, shared=False)
    firsts = [req(p, temperature=0.0, max_new_tokens=6 + 3 * i) for i, p in enumerate(ps)]
    a, b = rows.generate(firsts), fwd.generate(firsts)
    assert [o.completion_ids for o in a] == [o.completion_ids for o in b]
    more = tok(" And then? Tell me more about it.", add_special_tokens=False)["input_ids"]
    turn2 = [req(r.prompt_ids + o.completion_ids + more, temperature=0.0, max_new_tokens=7) for r, o in zip(firsts, a)]
    group = [req(ps[1], temperature=1.0, max_new_tokens=6, seed=70 + i) for i in range(4)]
    a2, b2 = rows.generate(turn2 + group), fwd.generate(turn2 + group)
    # greedy tokens must agree; sampled ones need not: the random model's next-token distribution at T=1 is
    # near flat over 49k tokens, so a 1e-6 change in the logits moves a CDF boundary across the same uniform
    # (seen on an H100: one of the 4 samples took another token at its 4th step, both paths within 2e-6 of HF)
    assert [o.completion_ids for o in a2[: len(turn2)]] == [o.completion_ids for o in b2[: len(turn2)]]
    assert len({tuple(o.completion_ids) for o in a2[len(turn2):]}) == len(group)  # forks drew their own tokens
    for name, outs in (("token-row", a2), ("lean forward", b2)):
        assert report(f"paged {name} prefill vs HF forward, fp32", forward_gaps(model, turn2 + group, outs)).max() < 1e-3
    assert rows.stats["row_prefills"] > 0 and rows.stats["forward_prefills"] == 0 and rows.stats["forks"] > 0
    assert fwd.stats["row_prefills"] == 0 and rows.stats["cached_tokens"] > 0
    print(f"[gpu] token-row prefill stats: {rows.stats}")


def test_split_attention_over_long_rows_keeps_tokens_and_logprobs(monkeypatch):
    """Rows past ``PAGED_LONG_KEYS`` keys decode with each row's keys split into runs (``paged_splits``) and
    added up by a second kernel: the same greedy tokens as one program a row, and both within 1e-3 of a full
    forward (fp32); in bf16 within the bounds of the short rows' test."""
    from masrl.engines.paged import PagedEngine
    from masrl.engines.paged.kernels import paged as paged_kernels
    from masrl.models import load_model

    for dtype in (torch.float32, torch.bfloat16):
        model, tok = load_model("random-smollm2-135m", seed=0, dtype=dtype, device="cuda")
        g = torch.Generator().manual_seed(3)
        long_prompts = [torch.randint(100, 40000, (n,), generator=g).tolist() for n in (700, 1500, 3000)]
        reqs = [req(p, temperature=t, max_new_tokens=12, seed=5) for p, t in zip(long_prompts, (0.0, 0.0, 1.0))]
        outs = {}
        for split in (True, False):
            eng = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", kv_blocks=512)
            assert "paged_attention_split" in eng.stats["fused_kernels"]
            eng.runner.fused["paged_attention_split"] = split
            outs[split] = eng.generate(reqs)
            assert any(k[1] == paged_kernels.PAGED_LONG_KEYS for k in eng.runner.graphs)  # the long class ran
        assert paged_kernels.paged_splits(4, 3, paged_kernels.PAGED_LONG_KEYS) > 1  # smollm2: 3 KV heads
        a, b = outs[True], outs[False]
        if dtype == torch.float32:  # in bf16 another order of the sums may tip a near tie of the random model
            assert [o.completion_ids for o in a[:2]] == [o.completion_ids for o in b[:2]]
        for name, o_ in (("split", a), ("one program a row", b)):
            gap = report(f"paged long rows, {name}, {str(dtype)[6:]}", forward_gaps(model, reqs, o_))
            if dtype == torch.float32:
                assert gap.max() < 1e-3
            else:
                assert gap.mean() < 0.05 and gap.max() < 0.5


def test_a_long_prompt_prefilled_in_chunks_by_flash_attention_keeps_tokens_and_logprobs():
    """A 3,000-token prompt prefilled 512 tokens at a time (each chunk over its past), bf16: flash attention with no
    mask (the engine's ``flash_one_row``) against the masked kernel it replaces: its logprobs as close to a full
    forward (random weights' near-flat logits make greedy tokens flip on either path's rounding); and the time of a
    16,000-token prefill on each path."""
    import time

    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-qwen2.5-0.5b", seed=0, dtype=torch.bfloat16, device="cuda")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (3000,), generator=g).tolist()
    reqs = [req(prompt, temperature=0.0, max_new_tokens=16), req(prompt[:1700], temperature=1.0, max_new_tokens=16,
                                                                 seed=3)]
    long = [req(torch.randint(100, 40000, (16000,), generator=g).tolist(), temperature=0.0, max_new_tokens=1)]
    got, secs, gaps = {}, {}, {}
    for flash in (False, True):
        eng = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", prefill_tokens=512, flash_one_row=flash)
        got[flash] = [eng.generate([r])[0] for r in reqs]  # one row a prefill: each chunk over its past
        big = PagedEngine(model, tok, [tok.eos_token_id], device="cuda:0", flash_one_row=flash)
        big.generate(long)  # one-time costs
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        big.generate([req(list(reversed(long[0].prompt_ids)), temperature=0.0, max_new_tokens=1)])
        torch.cuda.synchronize()
        secs[flash] = time.perf_counter() - t0
        gaps[flash] = report(f"chunked prefill, {'flash' if flash else 'masked'}", forward_gaps(model, reqs, got[flash]))
        eng.release()
        big.release()
    print(f"[gpu] 16,000-token prefill: masked {secs[False]:.3f} s, flash {secs[True]:.3f} s")
    assert gaps[True].mean() < 0.05 and gaps[True].max() < 0.5 and gaps[True].mean() < 2 * gaps[False].mean() + 1e-3
