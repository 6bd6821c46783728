"""Multi-agent environments: ``reset`` / per-agent ``step``, run as a workflow (``workflow: {name: env}``). The
interface lives here; environments live with their task family (``masrl.families``: ``hidden_sum``)."""

from masrl.envs.base import Environment, StepResult

__all__ = ["Environment", "StepResult"]
