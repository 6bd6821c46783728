"""Reward normalisation and advantage whitening per policy, against numbers worked out by hand."""

import pytest
import torch

from masrl.algorithms.normalize import RunningMoments, normalize_rewards, whiten
from masrl.config import AlgorithmConfig
from masrl.worker.updater.advantages import compute_advantages, train_rewards
from masrl.worker.updater.batching import Sample


def test_batch_and_running_normalisation_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    # mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25
    assert normalize_rewards(r, "batch").tolist() == pytest.approx([(x - 2.5) / 1.25 ** 0.5 for x in r.tolist()], abs=1e-5)
    stats = RunningMoments()
    first = normalize_rewards(torch.tensor([1.0, 2.0]), "running", stats)  # mean 1.5, var 0.25
    assert first.tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)
    second = normalize_rewards(torch.tensor([3.0, 4.0]), "running", stats)  # now over 1..4: mean 2.5, var 1.25
    assert (stats.count, stats.mean, stats.m2 / stats.count) == pytest.approx((4, 2.5, 1.25))
    assert second.tolist() == pytest.approx([0.5 / 1.25 ** 0.5, 1.5 / 1.25 ** 0.5], abs=1e-5)
    assert RunningMoments.from_state(stats.state_dict()) == stats
    assert normalize_rewards(r, "none") is r
    assert whiten(torch.tensor([0.0, 2.0])).tolist() == pytest.approx([-1.0, 1.0], abs=1e-5)


def _samples(rewards, tasks):
    return [Sample(f"c{i}", "p", [1], [2], [-0.1], 1.0, {"task_id": t, "agent": "a", "turn": 0}, reward=r)
            for i, (r, t) in enumerate(zip(rewards, tasks))]


def test_options_change_the_advantages_the_policy_trains_on():
    # two groups of two; rloo: advantage = r - mean of the others in the group
    s = _samples([1.0, 0.0, 10.0, 6.0], ["a", "a", "b", "b"])
    algo = AlgorithmConfig(advantage="rloo")
    train_rewards(s, algo)
    compute_advantages(s, algo)
    assert [x.advantage for x in s] == pytest.approx([1.0, -1.0, 4.0, -4.0])
    whitened = AlgorithmConfig(advantage="rloo", whiten_advantages=True)
    s2 = _samples([1.0, 0.0, 10.0, 6.0], ["a", "a", "b", "b"])
    train_rewards(s2, whitened)
    compute_advantages(s2, whitened)
    # [1, -1, 4, -4]: mean 0, population std sqrt((1 + 1 + 16 + 16) / 4) = sqrt(8.5)
    assert [x.advantage for x in s2] == pytest.approx([a / 8.5 ** 0.5 for a in (1, -1, 4, -4)], abs=1e-5)
    batch = AlgorithmConfig(advantage="rloo", reward_norm="batch")
    s3 = _samples([1.0, 0.0, 10.0, 6.0], ["a", "a", "b", "b"])
    train_rewards(s3, batch)
    std = torch.tensor([1.0, 0.0, 10.0, 6.0]).std(unbiased=False).item()  # mean 4.25
    assert [x.train_reward for x in s3] == pytest.approx([(r - 4.25) / std for r in (1, 0, 10, 6)], abs=1e-5)
    compute_advantages(s3, batch)
    assert [x.advantage for x in s3] == pytest.approx([1 / std, -1 / std, 4 / std, -4 / std], abs=1e-5)
    assert [x.reward for x in s3] == [1.0, 0.0, 10.0, 6.0]  # the allocated reward is kept as it was



def test_distinct_n_by_hand():
    from masrl.driver.observe.metrics import distinct_n

    texts = ["a b a", "a b c"]  # unigrams a b a a b c: 3 distinct of 6; bigrams ab ba ab bc: 3 of 4
    assert distinct_n(texts, 1) == 0.5 and distinct_n(texts, 2) == 0.75
    assert distinct_n(["same"] * 4, 1) == 0.25 and distinct_n([""], 2) == 0.0
