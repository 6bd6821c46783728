"""Multi-agent environments: ``reset`` / per-agent ``step``, run as a workflow (``workflow: {name: env}``)."""

from masrl.envs.base import Environment, StepResult
from masrl.envs.hidden_sum import HiddenSum

REGISTRY = {"hidden_sum": HiddenSum}

__all__ = ["Environment", "StepResult", "HiddenSum", "REGISTRY"]
