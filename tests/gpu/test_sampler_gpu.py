"""The fused sampler on a GPU: the inverse-CDF draw of ``sample_tokens`` at the vocabularies and batch
sizes the engines run, the frequencies of a known distribution, and both engines sampling with it
(a top-p batch falling back to torch)."""

import os
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from helpers import full_logprobs  # noqa: E402
from test_gpu import prompts, report, req  # noqa: E402


@pytest.mark.parametrize("vocab", [49152, 151936])
def test_fused_sampler_is_the_inverse_cdf_draw_at_every_batch(vocab):
    from masrl.engines.paged.kernels import sample as sample_kernel
    from masrl.engines.sampling import BatchFlags, sample_tokens

    assert sample_kernel.check(torch.device("cuda"), torch.bfloat16) == {"sample": None}
    g = torch.Generator(device="cuda").manual_seed(3)
    same = []
    for rows in (1, 7, 64, 256, 300):
        logits = (torch.randn(rows, vocab, generator=g, device="cuda") * 4).to(torch.bfloat16)
        temps = torch.tensor([0.0, 1.0, 0.6, 1.5], device="cuda").repeat(rows)[:rows]
        u = torch.rand(rows, generator=g, device="cuda")
        tokens, lps = sample_kernel.sample(logits, temps, u)
        assert sample_kernel.agrees(logits.float(), temps, u, tokens, lps), (rows, vocab)
        ref, _ = sample_tokens(logits, temps, torch.ones(rows, device="cuda"), None,
                               BatchFlags.of(temps.tolist(), [1.0] * rows), u)
        same.append(float((ref == tokens).float().mean()))
    print(f"[gpu] fused sampler, vocabulary {vocab:,}: the same token as sample_tokens in "
          f"{min(same):.3f}-{max(same):.3f} of rows")
    assert min(same) > 0.95


def test_fused_sampler_frequencies_match_the_softmax():
    from masrl.engines.paged.kernels import sample as sample_kernel

    g = torch.Generator(device="cuda").manual_seed(5)
    n, V, T = 200_000, 3000, 0.7
    row = torch.randn(V, generator=g, device="cuda") * 3
    p = torch.softmax(row.double() / T, -1)
    tokens, _ = sample_kernel.sample(row.expand(n, V), torch.full((n,), T, device="cuda"),
                                     torch.rand(n, generator=g, device="cuda"))
    freq = torch.bincount(tokens, minlength=V).double() / n
    big = p > 1e-3
    z = ((freq - p) / (p * (1 - p) / n).sqrt())[big]
    print(f"[gpu] fused sampler frequencies: {int(big.sum())} tokens above 1e-3, max |z| {z.abs().max():.2f}")
    assert z.abs().max() < 5


def seeded(r, seed):
    import dataclasses

    return dataclasses.replace(r, seed=seed)


def test_the_paged_engine_samples_with_it_and_top_p_falls_back():
    from masrl.engines.paged import PagedEngine
    from masrl.models import load_model

    model, tok = load_model("random-smollm2-135m", seed=0, dtype=torch.bfloat16, device="cuda")
    ps = prompts(tok, 6)
    for cls in (PagedEngine,):
        eng = cls(model, tok, [tok.eos_token_id], device="cuda:0")
        assert "sample" in eng.stats["fused_kernels"]
        reqs = [seeded(req(p, temperature=t, max_new_tokens=16), i) for i, (p, t) in enumerate(zip(ps, [1.0, 0.7, 0.0] * 2))]
        nucleus = [seeded(req(p, temperature=1.0, top_p=0.9, max_new_tokens=16), i) for i, p in enumerate(ps)]
        gaps = []
        for batch in (reqs, nucleus):
            for r, o in zip(batch, eng.generate(batch)):
                assert len(o.completion_ids) == 16
                gaps += (full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
                         - torch.tensor(o.logprobs)).abs().tolist()
        again = eng.generate(reqs)  # a seeded call draws the same tokens every time
        assert [o.completion_ids for o in again] == [o.completion_ids for o in eng.generate(reqs)]
        assert report(f"{cls.__name__} with the fused sampler vs HF forward, bf16", gaps).mean() < 0.05
