"""Task families: each one's tasks, roles and prompts, its team and the single agents it is measured against,
and its shipped configs, in one folder (``families/<name>/``: ``__init__`` names its ``WORKFLOWS``, ``SOURCES``,
``ENVS``, ``ROW_KINDS`` (``data.X.kind``: how a file's rows are read), ``DATA_COMMANDS`` (``masrl data NAME``),
``COMPARISONS`` (tables ``masrl compare`` adds) and ``SERVICES`` (defaults a run's tools are built on: ``corpus``, the
retriever's when ``retriever.corpus`` names none);
``configs/*.yaml`` its runs). The framework (workflows'
base, graphs, engines, worker, driver) knows none of them; the registries the driver looks names up in are built
here, from the families and the framework's own.

A shipped config is named by family and file: ``masrl train math/solver`` runs
``families/math/configs/solver.yaml`` (a path to any YAML file works as well).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from masrl.config.loading import load_object
from masrl.data import sources
from masrl.data.commands import Comparison, DataCommand
from masrl.data.sources import ROW_KINDS as FRAMEWORK_ROW_KINDS
from masrl.data.sources import SOURCES as FRAMEWORK_SOURCES
from masrl.data.sources import Source
from masrl.errors import ConfigError
from masrl.families import code, games, hidden_sum, math, qa, reasoning_gym
from masrl.workflows import SOURCES as WORKFLOW_SOURCES
from masrl.workflows import WORKFLOWS as FRAMEWORK_WORKFLOWS

ROOT = Path(__file__).resolve().parent
FAMILIES = {"math": math, "code": code, "qa": qa, "reasoning_gym": reasoning_gym, "games": games,
            "hidden_sum": hidden_sum}


def _merged(attr: str, base: dict) -> dict:
    out = dict(base)
    for fam, pkg in FAMILIES.items():
        for name, value in getattr(pkg, attr, {}).items():
            if name in out:
                raise RuntimeError(f"families.{fam}.{attr}: '{name}' is already registered")
            out[name] = value
    return out


WORKFLOWS: dict[str, Any] = _merged("WORKFLOWS", FRAMEWORK_WORKFLOWS)
SOURCES: dict[str, Source] = _merged("SOURCES", {**FRAMEWORK_SOURCES, **WORKFLOW_SOURCES})
ENVS: dict[str, Any] = _merged("ENVS", {})
DATA_COMMANDS: dict[str, DataCommand] = _merged("DATA_COMMANDS", {})  # ``masrl data NAME``
COMPARISONS: dict[str, Comparison] = _merged("COMPARISONS", {})  # ``masrl compare RUN... --head-to-head N``
ROW_KINDS: dict[str, Any] = _merged("ROW_KINDS", FRAMEWORK_ROW_KINDS)  # ``data.X.kind``: how a row is read
SERVICES: dict[str, Any] = _merged("SERVICES", {})  # ``corpus(data.world) -> path``: the default search corpus


def build_workflow(name: str, options: dict):
    """The workflow ``name`` (a registered one or ``module:Class``) built with ``options``; a family's
    environment and a shipped graph file are found by name (``env: hidden_sum``, ``path: qa/graphs/rag.yaml``)."""
    cls = WORKFLOWS.get(name) or load_object(name, "workflow")
    options = dict(options)
    if name == "env" and "env" not in options:
        raise ConfigError(f"workflow.options.env: the env workflow runs an environment; name one: a family's "
                          f"({', '.join(sorted(ENVS))}) or your own 'module:Class'")
    if name == "env" and isinstance(options["env"], str) and options["env"] in ENVS:
        options["env"] = ENVS[options["env"]]
    if name == "graph" and isinstance(options.get("path"), str):
        options["path"] = str(graph_path(options["path"]))
    _check_options(name, cls, options)
    try:
        return cls(**options)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"workflow.options for '{name}': {exc}") from None
    except Exception as exc:  # a user's workflow raised while it was built: a config error, named
        raise ConfigError(f"workflow '{name}': building it raised {type(exc).__name__}: {str(exc)[:300]}") from None


def _check_options(name: str, cls, options: dict) -> None:
    """Every option is one the workflow takes (unless it takes any): a typo is named, with a close match."""
    import difflib
    import inspect

    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a callable without a signature: it judges its own options
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    takes = [p for p, v in params.items() if v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)]
    for key in options:
        if key not in takes:
            close = difflib.get_close_matches(key, takes, n=1)
            raise ConfigError(f"workflow.options.{key}: workflow '{name}' has no option '{key}'"
                              + (f" (did you mean `{close[0]}`?)" if close else "")
                              + f"; its options: {', '.join(takes) or 'none'}")


def graph_path(path: str) -> Path:
    """A graph file: the path as given, else a shipped one (``qa/graphs/rag.yaml`` under a family's configs)."""
    p = Path(path).expanduser()
    if p.is_file() or p.is_absolute():
        return p
    fam, _, rest = path.partition("/")
    shipped = ROOT / fam / "configs" / rest
    return shipped if fam in FAMILIES and shipped.is_file() else p


def shipped_configs() -> dict[str, Path]:
    """Every shipped config by its name (``family/file``), e.g. ``math/solver``."""
    return {f"{fam}/{p.stem}": p for fam in FAMILIES for p in sorted((ROOT / fam / "configs").glob("*.yaml"))}


def config_path(arg: str) -> Path:
    """What ``masrl train ARG`` reads: the file ``ARG``, else the shipped config of that name (``math/solver``)."""
    p = Path(arg).expanduser()
    if p.is_file():
        return p
    shipped = shipped_configs()
    name = arg[:-5] if arg.endswith(".yaml") else arg
    if name in shipped:
        return shipped[name]
    import difflib

    close = difflib.get_close_matches(name, list(shipped), n=4, cutoff=0.5)
    what = f"config file '{arg}' does not exist" if p.is_absolute() or arg.endswith((".yaml", ".yml")) else \
        f"config '{arg}': no such file, and no shipped config of that name"
    raise ConfigError(what + (f"; did you mean {', '.join(close)}?" if close else "")
                      + " (shipped configs are named family/name, e.g. math/solver; `masrl configs` lists them)")


# the data loop over every registered source (data/sources.py's, with the families' generators)
def check_source(src, key: str) -> Source:
    return sources.check_source(src, key, SOURCES, ROW_KINDS)


def load_tasks(src, **kwargs):
    return sources.load_tasks(src, sources=SOURCES, kinds=ROW_KINDS, **kwargs)


def build_tasks(cfg):
    return sources.build_tasks(cfg, SOURCES, ROW_KINDS)


def more_tasks_hint(src) -> str:
    return sources.more_tasks_hint(src, SOURCES)
