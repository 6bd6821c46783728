"""Workflows, registered by name; 'module:Class' loads your own."""

from __future__ import annotations

from masrl.config.loading import load_object
from masrl.errors import ConfigError
from masrl.workflows.code_docs import CodeDocsAgent, CodeDocsTeam
from masrl.workflows.code_team import CodeSolver, CodeTeam
from masrl.workflows.debate import Debate
from masrl.workflows.env import EnvWorkflow
from masrl.workflows.external import External
from masrl.workflows.graph import Graph
from masrl.workflows.math_chain import MathChainAgent, MathChainTeam
from masrl.workflows.math_checked import MathChecked
from masrl.workflows.math_solver import MathSolver
from masrl.workflows.math_team import MathTeam
from masrl.workflows.rag import RAG
from masrl.workflows.reading import ReadingAgent, ReadingTeam
from masrl.workflows.reading_hops import ReadingHops, ReadingHopsAgent
from masrl.workflows.rg import ReasoningGymChecked, ReasoningGymSolver
from masrl.workflows.search_team import SearchAgent, SearchTeam

REGISTRY = {"math_team": MathTeam, "math_solver": MathSolver,
            "math_checked": MathChecked, "math_chain_team": MathChainTeam, "math_chain_agent": MathChainAgent,
            "code_team": CodeTeam, "code_solver": CodeSolver,
            "code_docs_team": CodeDocsTeam, "code_docs_agent": CodeDocsAgent,
            "debate": Debate, "search_team": SearchTeam, "search_agent": SearchAgent,
            "reading_team": ReadingTeam, "reading_agent": ReadingAgent,
            "reading_hops": ReadingHops, "reading_hops_agent": ReadingHopsAgent,
            "rg_solver": ReasoningGymSolver, "rg_checked": ReasoningGymChecked,
            "rag": RAG, "graph": Graph, "env": EnvWorkflow, "external": External}


def build_workflow(name: str, options: dict):
    cls = REGISTRY.get(name) or load_object(name, "workflow")
    try:
        return cls(**options)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"workflow.options for '{name}': {exc}") from None
