import torch

from masrl.engines.sampling import inverse_cdf_sample, sample_tokens, top_p_filter
from masrl.modeling.prefix import common_prefix_len, group_by_prefix


def test_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = torch.isfinite(top_p_filter(logits, torch.tensor([0.8])))
    assert kept.tolist() == [[True, True, False, False]]
    kept = torch.isfinite(top_p_filter(logits, torch.tensor([1.0])))
    assert kept.all()
    kept = torch.isfinite(top_p_filter(logits, torch.tensor([0.1])))
    assert kept.tolist() == [[True, False, False, False]]  # the top token always stays


def test_inverse_cdf_matches_distribution():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]]).expand(20000, 4).contiguous()
    freq = torch.bincount(inverse_cdf_sample(p, g), minlength=4) / 20000.0
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.02)
    assert freq[3] == 0


def test_greedy_rows_and_logprobs():
    logits = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0]])
    toks, lps = sample_tokens(logits, torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert toks.tolist() == [1, 1]
    assert torch.allclose(lps, torch.log_softmax(logits, -1)[:, 1])
    # sampled row at T=0.5 reports the logprob under logits / 0.5
    g = torch.Generator().manual_seed(1)
    toks, lps = sample_tokens(logits, torch.tensor([0.5, 0.0]), torch.tensor([1.0, 1.0]), g)
    assert torch.allclose(lps[0], torch.log_softmax(logits[0] / 0.5, -1)[toks[0]])


def test_prefix_grouping():
    a = [1, 2, 3, 4, 5, 6, 7, 8, 10]
    b = [1, 2, 3, 4, 5, 6, 7, 8, 11, 12]
    c = [9, 9, 9, 9, 9, 9, 9, 9, 9]
    assert common_prefix_len(a, b) == 8
    groups = group_by_prefix([a, c, b], min_prefix=4)
    assert sorted((sorted(r), n) for r, n in groups) == [([0, 2], 8), ([1], 0)]
    # a prefix never swallows a whole prompt
    assert group_by_prefix([a, a], min_prefix=4) == [([0, 1], len(a) - 1)]
    # different keys (adapters) never share
    assert all(n == 0 for _, n in group_by_prefix([a, b], keys=["x", "y"], min_prefix=4))
    assert [len(r) for r, _ in group_by_prefix([a] * 5, min_prefix=4, max_group=2)] == [2, 2, 1]
