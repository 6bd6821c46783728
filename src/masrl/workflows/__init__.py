"""Workflows, registered by name; 'module:Class' loads your own."""

from __future__ import annotations

import importlib

from masrl.errors import ConfigError
from masrl.workflows.code_team import CodeSolver, CodeTeam
from masrl.workflows.debate import Debate
from masrl.workflows.math_solver import MathSolver
from masrl.workflows.math_team import MathTeam
from masrl.workflows.env import EnvWorkflow
from masrl.workflows.graph import Graph
from masrl.workflows.rag import RAG
from masrl.workflows.search_team import SearchAgent, SearchTeam

REGISTRY = {"math_team": MathTeam, "math_solver": MathSolver, "code_team": CodeTeam, "code_solver": CodeSolver,
            "debate": Debate, "search_team": SearchTeam, "search_agent": SearchAgent,
            "rag": RAG, "graph": Graph, "env": EnvWorkflow}


def load_object(ref: str, what: str):
    """Import ``module:attr``; errors say what to fix."""
    if ":" not in ref:
        raise ConfigError(f"{what} '{ref}' is not registered; use a registered name or 'module:attr'")
    mod_name, attr = ref.split(":", 1)
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"{what} '{ref}': cannot import module '{mod_name}' ({exc})") from None
    try:
        return getattr(mod, attr)
    except AttributeError:
        raise ConfigError(f"{what} '{ref}': module '{mod_name}' has no attribute '{attr}'") from None


def build_workflow(name: str, options: dict):
    cls = REGISTRY.get(name) or load_object(name, "workflow")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"workflow.options for '{name}': {exc}") from None
