"""Per-policy schedules: LR warm-up and decay by hand, and the weight EMA's arithmetic."""

import math

import pytest
import torch

from masrl.algorithms.schedules import WeightEMA, lr_factor


def test_lr_factor_warmup_then_decay_by_hand():
    assert [lr_factor(u, warmup=4) for u in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    # linear over updates 0..4 (total 5, no warm-up), reaching 0 at update 5: 1, .8, .6, .4, .2
    assert [lr_factor(u, total=5, decay="linear") for u in range(5)] == pytest.approx([1, 0.8, 0.6, 0.4, 0.2])
    # cosine toward min_ratio 0.1 over updates 2..5 after 2 warm-up updates: t = 0, 1/3, 2/3
    got = [lr_factor(u, warmup=2, total=5, decay="cosine", min_ratio=0.1) for u in range(5)]
    cos = lambda t: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))  # noqa: E731
    assert got == pytest.approx([0.5, 1.0, 1.0, cos(1 / 3), cos(2 / 3)])
    assert got[-1] > 0.1  # the last update still moves the weights
    assert lr_factor(99, total=5, decay="linear") == 0.0  # past the end it stays at the floor


def test_weight_ema_by_hand_and_swap():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    ema = WeightEMA([p], decay=0.5)
    with torch.no_grad():
        p.copy_(torch.tensor([3.0, 6.0]))
    ema.update()  # 0.5 * [1, 2] + 0.5 * [3, 6]
    assert ema.shadow[0].tolist() == [2.0, 4.0]
    with ema.swapped_in():
        assert p.tolist() == [2.0, 4.0]
    assert p.tolist() == [3.0, 6.0]
