"""The advantages an update trains on: each call's training reward (``algorithm.reward_norm``), then the
estimator's advantage for it (``algorithm.advantage``: per sequence, or per token), over every rank's calls
when a policy is data parallel. Estimators that read values run after the no-grad passes put them in.
"""

from __future__ import annotations

import torch

from masrl.algorithms.estimators import EstimatorBatch, estimator_options, get_estimator, needs_critic
from masrl.algorithms.grouping import group_ids
from masrl.algorithms.normalize import normalize_rewards
from masrl.algorithms.normalize import whiten as whiten_adv
from masrl.worker.updater.batching import Sample, pad_rows


def train_rewards(samples: list[Sample], algo, stats=None) -> None:
    """Each sample's reward as the estimator sees it (``algorithm.reward_norm``), in ``train_reward``."""
    rewards = torch.tensor([float(s.reward) for s in samples], dtype=torch.float64)
    for s, r in zip(samples, normalize_rewards(rewards, algo.reward_norm, stats).tolist()):
        s.train_reward = r


def compute_advantages(samples: list[Sample], algo, state: dict | None = None) -> None:
    """Set each sample's ``advantage`` (a sequence estimator) or ``token_adv`` (a token-level one;
    with ``returns`` when it needs a critic, whose values ``training._prepare`` put in ``old_values``)."""
    est = get_estimator(algo.advantage)
    keys = [tuple(s.key.get(k) if k != "policy" else s.policy for k in algo.group_key) for s in samples]
    rewards = torch.tensor([s.train_reward if s.train_reward is not None else float(s.reward) for s in samples],
                           dtype=torch.float64)
    T = max(len(s.completion_ids) for s in samples)
    mask = pad_rows([[1.0] * len(s.completion_ids) for s in samples], T)
    values = pad_rows([s.old_values for s in samples], T) if est.needs_critic else None
    batch = EstimatorBatch(rewards, group_ids(keys), mask, values, keys=[dict(s.key, policy=s.policy) for s in samples],
                           state=state if state is not None else {})
    out = est.fn(batch, **estimator_options(est, algo))
    if est.needs_critic:
        adv, returns = out
        for i, s in enumerate(samples):
            n = len(s.completion_ids)
            s.token_adv, s.returns = adv[i, :n].tolist(), returns[i, :n].tolist()
        return
    adv = torch.as_tensor(out, dtype=torch.float64)
    want = (len(samples), T) if est.token_level else (len(samples),)
    if tuple(adv.shape) != want:
        raise ValueError(f"algorithm.advantage '{algo.advantage}' returned shape {tuple(adv.shape)} for "
                         f"{len(samples)} samples; return {'[N, T] (token-level)' if est.token_level else '[N]'}: "
                         f"{list(want)}")
    if est.token_level:
        for i, s in enumerate(samples):
            s.token_adv = adv[i, : len(s.completion_ids)].tolist()
        return
    if algo.whiten_advantages:
        adv = whiten_adv(adv)
    for s, a in zip(samples, adv.tolist()):
        s.advantage = a



def advantages_of_everyone(samples: list[Sample], algo, reward_stats, dp, state: dict | None = None) -> list[Sample]:
    """Training rewards and (unless the estimator needs values, which come later) advantages.
    Data parallel: statistics and advantages over every rank's calls, copied back to this rank's
    own; the mini-batch order is drawn over all of them too. Returns every rank's calls."""
    everyone = dp.gather(samples) if dp is not None else samples
    train_rewards(everyone, algo, reward_stats)
    if not needs_critic(algo):
        compute_advantages(everyone, algo, state)
    if dp is not None:
        own = {s.call_id: s for s in samples}
        for s in everyone:
            if s.call_id in own:
                mine = own[s.call_id]
                mine.train_reward, mine.advantage, mine.token_adv = s.train_reward, s.advantage, s.token_adv
    return everyone
