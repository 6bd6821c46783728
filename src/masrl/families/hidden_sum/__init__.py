"""A cooperative two-agent environment (``workflow: {name: env, options: {env: hidden_sum}}``): the scout must
message a hidden number to the solver, who answers a sum."""

from __future__ import annotations

from masrl.families.hidden_sum.env import HiddenSum

ENVS = {"hidden_sum": HiddenSum}
