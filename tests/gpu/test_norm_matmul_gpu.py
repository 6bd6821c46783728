"""``norm_matmul`` on a GPU: the fused RMSNorm + matmul (+ SiLU-mul) agrees with the kernels it replaces at
the 0.5B shape at every batch size, and engines decoding with it keep their logprobs against a full
forward in bf16, LoRA batches (which read the normalised input) included."""

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import adapter_logprobs, full_logprobs  # noqa: E402
from test_gpu import prompts, report, req, two_adapter_model  # noqa: E402


@pytest.mark.parametrize("rows", [1, 5, 64, 256, 1000])
def test_norm_matmul_agrees_with_the_separate_kernels(rows):
    from masrl.engines import kernels
    from masrl.engines.norm_matmul import norm_matmul, norm_matmul_ref

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 896, generator=g, device="cuda").to(torch.bfloat16)
    ln = (1 + 0.1 * torch.randn(896, generator=g, device="cuda")).to(torch.bfloat16)
    for n, gated, bias in ((1152, False, True), (2 * 4864, True, False)):
        w = (0.03 * torch.randn(n, 896, generator=g, device="cuda")).to(torch.bfloat16)
        b = (0.1 * torch.randn(n, generator=g, device="cuda")).to(torch.bfloat16) if bias else None
        xn = torch.empty_like(x)
        got = norm_matmul(x, ln, 1e-6, w, b, gated=gated, xn=xn)
        exact = norm_matmul_ref(x.float(), ln.float(), 1e-6, w.float(), None if b is None else b.float(), gated=gated)
        y = torch.nn.functional.linear(kernels.rms_norm(x, ln, 1e-6), w, b)  # what the step ran before
        before = kernels.silu_mul(y) if gated else y
        err, err_before = (got.float() - exact).abs().max().item(), (before.float() - exact).abs().max().item()
        print(f"[gpu] norm_matmul rows {rows} n {n}{' gated' if gated else ''}: max |err| vs fp32 {err:.2e} "
              f"(separate kernels {err_before:.2e})")
        assert err <= 2 * err_before + 1e-2
        # the normalised input, as the norm kernel rounds it (its sum of squares is added up in another order)
        torch.testing.assert_close(xn.float(), kernels.rms_norm(x, ln, 1e-6).float(), rtol=8e-3, atol=1e-5)


@pytest.mark.parametrize("fuse", [True, False], ids=["norm_matmul", "separate"])
def test_engines_keep_their_logprobs_with_the_norm_in_the_matmul(fuse, monkeypatch):
    from masrl.engines import norm_matmul
    from masrl.engines.paged import PagedEngine
    from masrl.engines.static import StaticEngine
    from masrl.models import load_model

    monkeypatch.setattr(norm_matmul, "MIN_ROWS", 1 if fuse else 1 << 62)
    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.bfloat16, device="cuda")
    ps = prompts(tok, 6) + prompts(tok, 3, shared=False)
    reqs = [req(p, temperature=t, max_new_tokens=n) for p, t, n in zip(ps, [1.0, 0.7, 0.0] * 3, [5, 17, 9, 33, 3, 12, 8, 40, 2])]
    for cls in (PagedEngine, StaticEngine):
        eng = cls(model, tok, [tok.eos_token_id], device="cuda:0")
        assert "norm_matmul" in eng.stats["fused_kernels"]
        gaps = []
        for r, o in zip(reqs, eng.generate(reqs)):
            ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
            gaps += (ref - torch.tensor(o.logprobs)).abs().tolist()
        g = report(f"{cls.__name__} vs HF forward, bf16, norm_matmul {'on' if fuse else 'off'}", gaps)
        assert g.mean() < 0.05 and g.max() < 0.5

    pm, tok = two_adapter_model()
    pm = pm.to(torch.bfloat16)
    adapters = ["a", "b", None, "a", "b", "b", "a", None]
    reqs = [req(p, temperature=0.0, max_new_tokens=12, adapter=a) for p, a in zip(prompts(tok, 8), adapters)]
    gaps = []
    for r, m in zip(reqs, PagedEngine(pm, tok, [tok.eos_token_id], device="cuda:0").generate(reqs)):
        ref = adapter_logprobs(pm, r.adapter, r.prompt_ids, m.completion_ids)
        gaps += (ref - torch.tensor(m.logprobs)).abs().tolist()
    g = report(f"paged LoRA mixed batch vs per-adapter HF forward, bf16, norm_matmul {'on' if fuse else 'off'}", gaps)
    assert g.mean() < 0.05 and g.max() < 0.5
