"""The framework's workflows: YAML graphs (``graph``), environments (``env``; OpenEnv's: ``openenv``) and programs
outside masrl (``external``). Task families add theirs (``masrl.families``), and ``masrl.families.build_workflow`` builds any
of them by name, or ``module:Class`` for your own."""

from __future__ import annotations

from masrl.workflows.env import EnvWorkflow
from masrl.workflows.external import External
from masrl.workflows.graph import Graph
from masrl.workflows.openenv import OpenEnvWorkflow

WORKFLOWS = {"graph": Graph, "env": EnvWorkflow, "external": External, "openenv": OpenEnvWorkflow}
