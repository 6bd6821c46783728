"""Advantage estimators and losses: pure tensor functions, registered by name."""

from __future__ import annotations

from masrl.algorithms.gae import gae_advantages
from masrl.algorithms.grpo import grpo_advantages
from masrl.algorithms.reinforce_pp import reinforce_pp_advantages
from masrl.algorithms.rloo import rloo_advantages

# Sequence-level estimators: (rewards [N], group ids [N], options) -> advantages [N].
SEQUENCE_ESTIMATORS = {
    "grpo": lambda r, g, o: grpo_advantages(r, g, std_normalize=o.std_normalize),
    "rloo": lambda r, g, o: rloo_advantages(r, g),
    "reinforce_pp": lambda r, g, o: reinforce_pp_advantages(r, g, baseline=o.baseline),
}
# Token-level estimators that need a critic.
CRITIC_ESTIMATORS = {"gae": gae_advantages}
ESTIMATORS = (*SEQUENCE_ESTIMATORS, *CRITIC_ESTIMATORS)
