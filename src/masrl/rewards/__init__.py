"""Reward allocators: bind scalar rewards to calls. Registered by name; 'module:factory' for your own."""

from __future__ import annotations

from masrl.rewards.base import RewardAllocator, RewardFailure, combine, combine_all
from masrl.rewards.counterfactual import CounterfactualReward
from masrl.rewards.credit import CreditReward
from masrl.rewards.format import FormatReward
from masrl.rewards.judge import JudgeReward
from masrl.rewards.outcome import OutcomeReward
from masrl.rewards.turn_delta import TurnDeltaReward

REGISTRY = {"outcome": OutcomeReward, "format": FormatReward, "turn_delta": TurnDeltaReward, "credit": CreditReward,
            "judge": JudgeReward, "counterfactual": CounterfactualReward}

__all__ = ["REGISTRY", "RewardAllocator", "RewardFailure", "combine", "combine_all", "OutcomeReward", "FormatReward",
           "TurnDeltaReward", "CreditReward",
           "JudgeReward", "CounterfactualReward"]
