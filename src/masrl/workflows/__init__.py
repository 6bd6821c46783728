"""The framework's workflows: YAML graphs (``graph``), environments (``env``; the field's standards: ``openenv``,
``verifiers``) and programs outside masrl (``external``). Task families add theirs (``masrl.families``), and
``masrl.families.build_workflow`` builds any of them by name, or ``module:Class`` for your own."""

from __future__ import annotations

from masrl.data.sources import Source
from masrl.workflows.env import EnvWorkflow
from masrl.workflows.external import External
from masrl.workflows.graph import Graph
from masrl.workflows.openenv import OpenEnvWorkflow
from masrl.workflows.verifiers import VerifiersWorkflow, check_source_options, verifiers_tasks

WORKFLOWS = {"graph": Graph, "env": EnvWorkflow, "external": External, "openenv": OpenEnvWorkflow,
             "verifiers": VerifiersWorkflow}
# the tasks of an environment standard that brings its own (a verifiers taskset)
SOURCES = {"verifiers": Source(verifiers_tasks, more="The taskset holds no more tasks",
                               options=check_source_options)}
