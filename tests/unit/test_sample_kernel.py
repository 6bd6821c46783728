"""The fused sampler's host side on a CPU: the split layout covers the vocabulary, and the check that
gates the kernel (``agrees``) accepts torch's own inverse-CDF draw and refuses a token one off. The kernel
itself runs in Triton's interpreter (tests/unit/test_fused_ops.py) and on a GPU (tests/gpu)."""

import torch

from masrl.engines.paged.kernels import sample as sample_kernel
from masrl.engines.sampling import BatchFlags, sample_tokens


def test_split_layout_covers_the_vocabulary_in_whole_blocks():
    for rows in (1, 3, 64, 256, 512):
        for vocab in (1000, 49152, 151936):
            splits, chunk = sample_kernel.layout(rows, vocab)
            assert chunk % sample_kernel.BLOCK == 0
            assert (splits - 1) * chunk < vocab <= splits * chunk  # every split holds a token
    assert sample_kernel.layout(256, 151936)[0] == 2 and sample_kernel.layout(1, 151936)[0] > 100


def test_agrees_accepts_the_torch_draw_and_refuses_a_token_one_off():
    g = torch.Generator().manual_seed(0)
    rows, vocab = 64, 500
    logits = torch.randn(rows, vocab, generator=g) * 2
    temps = torch.tensor([0.0, 1.0, 0.7, 1.3]).repeat(rows // 4)
    u = torch.rand(rows, generator=g)
    tokens, lps = sample_tokens(logits, temps, torch.ones(rows), None, BatchFlags.of(temps.tolist(), [1.0] * rows), u)
    assert sample_kernel.agrees(logits, temps, u, tokens, lps)
    for r in (0, 1):  # a greedy row and a sampled row
        off = tokens.clone()
        off[r] = (off[r] + 1) % vocab
        assert not sample_kernel.agrees(logits, temps, u, off, lps)
    bad_lp = lps.clone()
    bad_lp[2] -= 0.1
    assert not sample_kernel.agrees(logits, temps, u, tokens, bad_lp)


def test_the_check_says_why_it_is_off_without_a_gpu():
    assert sample_kernel.check(torch.device("cpu"), torch.float32) == {"sample": "needs triton on a CUDA device"}
