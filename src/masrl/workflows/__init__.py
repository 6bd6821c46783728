"""The framework's workflows: YAML graphs (``graph``), environments (``env``) and programs outside masrl
(``external``). Task families add theirs (``masrl.families``), and ``masrl.families.build_workflow`` builds any
of them by name, or ``module:Class`` for your own."""

from __future__ import annotations

from masrl.workflows.env import EnvWorkflow
from masrl.workflows.external import External
from masrl.workflows.graph import Graph

WORKFLOWS = {"graph": Graph, "env": EnvWorkflow, "external": External}
