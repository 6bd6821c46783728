"""Task sources by name: ``data.train.source`` / ``data.eval.source`` pick one.

The framework's: ``episodes`` (seeds for an environment) and ``file`` (JSONL or Parquet rows of a ``kind``:
the framework's ``math`` rows, a question and a numeric answer, or a family's: ``code``, ``qa``); every task
family adds its own sources and row kinds (``masrl.families``: ``arithmetic``, ``math_chain``, ``code_gen``,
``code_docs``, ``humaneval``, ``qa_world``, ``reasoning_gym``), and the driver looks names up in their union.
Your own is ``source: 'module:function'``: a function ``f(spec: SourceSpec) ->
Iterable[Task | dict]``. Rows it returns as dicts are read like a file's rows of ``kind`` (the same field
aliases, the same errors naming the row), so a source that only fetches rows needs no parsing of its own;
``options`` are yours (``data.train.options``; a source that takes options checks them itself). Every
source's rows go through one row loop (``loader.tasks_from_rows``), and held-out questions are removed from
training by text.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from masrl.config import DataSourceConfig, RunConfig, WorldConfig
from masrl.config.loading import load_object
from masrl.data.loader import RowTask, math_task, read_rows, tasks_from_rows
from masrl.data.tasks import Task
from masrl.errors import ConfigError, DataError


@dataclass(frozen=True)
class SourceSpec:
    """What a source is asked for: a split's settings, plus the questions it must not return
    (a built-in generator draws more in their place; others' are filtered out afterwards)."""

    n: int | None
    seed: int
    levels: tuple[int, ...]
    kind: str
    path: str | None
    options: dict[str, Any] = field(default_factory=dict)
    world: WorldConfig = field(default_factory=WorldConfig)
    exclude: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Source:
    fn: Callable[[SourceSpec], Iterable[Task | dict]]
    levels: tuple[int, ...] = (1, 2, 3, 4)  # the ``levels`` it allows (a source that has none ignores them)
    needs_path: bool = False
    more: str = ""  # where more tasks come from, for the run's warning when a split is short of its ``n``
    options: Callable[[dict, str], Any] | None = None  # checks ``options`` (raising ConfigError); None: takes none


def _episodes(s: SourceSpec) -> list[Task]:
    """Seeds for an environment's episodes (the environment and game workflows); ``options`` (the seating of a split's
    games, e.g. held-out games against the random player) go to every task's ``meta``."""
    rng = random.Random(f"episodes-{s.seed}")
    seeds = [rng.getrandbits(48) for _ in range(s.n or 1000)]
    # ``index``: the game's place in its split, so that seats swapped every other game split it half and half
    return [Task(f"ep-{s.seed}-{i}", f"episode {x}", None, {"seed": x, "index": i, **s.options})
            for i, x in enumerate(seeds)]


def _seating(options: dict, key: str) -> None:
    """Any ``options``: the seating of a split's games, read and checked by the workflow that seats players (its
    ``check_split``; the games family's); the run's check refuses them for a workflow without one."""


def _file(s: SourceSpec) -> list[dict]:
    return read_rows(s.path)  # type: ignore[arg-type]


# the framework's own sources; each task family adds its generators (masrl.families.SOURCES has them all)
SOURCES: dict[str, Source] = {
    "episodes": Source(_episodes, options=_seating),
    "file": Source(_file, needs_path=True, more="The file holds no more rows"),
}
Sources = dict[str, Source]
# the framework's own row kind (``data.X.kind``); each family adds its rows' (masrl.families.ROW_KINDS)
ROW_KINDS: dict[str, RowTask] = {"math": math_task}


def more_tasks_hint(src: DataSourceConfig, sources: Sources) -> str:
    """How to get more tasks from ``src``'s source (empty where the source does not say)."""
    builtin = sources.get(src.source)
    return builtin.more if builtin is not None else ""


def check_source(src: DataSourceConfig, key: str, sources: Sources, kinds: dict[str, RowTask] | None = None) -> Source:
    """The source ``src`` names (among ``sources``), with its settings checked (its ``kind`` among ``kinds``, by
    default the framework's); errors name ``key`` and the fix."""
    kinds = ROW_KINDS if kinds is None else kinds
    if src.kind not in kinds:
        raise ConfigError(f"{key}.kind: unknown row kind '{src.kind}'; use one of {', '.join(sorted(kinds))} (how a "
                          f"row's fields are read: a task family adds its own)")
    builtin = sources.get(src.source)
    if builtin is None:
        if ":" not in src.source:
            import difflib

            close = difflib.get_close_matches(src.source, list(sources), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ConfigError(f"{key}.source: unknown source '{src.source}'; {hint}use one of {', '.join(sorted(sources))} "
                              f"or your "
                              f"own 'module:function' (f(spec: SourceSpec) -> tasks or rows)")
        fn = load_object(src.source, f"{key}.source")
        if not callable(fn):
            raise ConfigError(f"{key}.source: '{src.source}' is not a function")
        return Source(fn)
    if builtin.needs_path and not src.path:
        raise ConfigError(f"{key}: source '{src.source}' needs `path`: a JSONL or Parquet file")
    if builtin.options is not None:
        builtin.options(src.options, key)
    elif src.options:
        raise ConfigError(f"{key}.options: source '{src.source}' takes no options (options are for your own "
                          f"'module:function' source and for reasoning_gym); remove them")
    if any(level not in builtin.levels for level in src.levels):
        raise ConfigError(f"{key}.levels: levels of source '{src.source}' must be among "
                          f"{', '.join(map(str, builtin.levels))}; got {src.levels}")
    return builtin


def load_tasks(src: DataSourceConfig, *, sources: Sources, kinds: dict[str, RowTask] | None = None,
               exclude: set[str] | None = None, world: WorldConfig | None = None, key: str = "data") -> list[Task]:
    """The tasks of one split: the source's tasks, its dict rows read as ``src.kind`` rows, the
    first ``n`` kept, ``exclude``'s questions left out."""
    source = check_source(src, key, sources, kinds)
    spec = SourceSpec(src.n, src.seed, tuple(src.levels), src.kind, src.path, dict(src.options),
                      world or WorldConfig(), frozenset(exclude or ()))
    origin = src.path if src.source == "file" else f"{key}.source '{src.source}'"
    row_task = (ROW_KINDS if kinds is None else kinds)[src.kind]

    def read(row, where, i):
        return row if isinstance(row, Task) else row_task(row, where, i)

    try:
        produced = source.fn(spec)
        if isinstance(produced, (str, bytes, dict)) or not hasattr(produced, "__iter__"):
            raise DataError(f"{origin} returned {type(produced).__name__}; a source returns (or yields) tasks "
                            f"(masrl.data.Task) or rows (dicts)")
        tasks = tasks_from_rows(_as_rows(produced, origin), origin, read, src.n)
    except (DataError, ConfigError):
        raise
    except Exception as exc:  # the user's source failed: say which, keep its traceback
        raise DataError(f"{origin} raised {type(exc).__name__}: {exc}") from exc
    return [t for t in tasks if t.question not in spec.exclude] if spec.exclude else tasks


def _as_rows(items: Iterable, origin: str) -> Iterable:
    for i, x in enumerate(items):
        if not isinstance(x, (Task, dict)):
            raise DataError(f"{origin} row {i}: a {type(x).__name__}; a source gives masrl.data.Task objects or dicts")
        yield x


def build_tasks(cfg: RunConfig, sources: Sources, kinds: dict[str, RowTask] | None = None
                ) -> tuple[list[Task], list[Task]]:
    """Train and held-out tasks; train tasks never repeat an eval question."""
    eval_tasks = load_tasks(cfg.data.eval, sources=sources, kinds=kinds, world=cfg.data.world, key="data.eval")
    train_tasks = load_tasks(cfg.data.train, sources=sources, kinds=kinds, exclude={t.question for t in eval_tasks},
                             world=cfg.data.world, key="data.train")
    if not train_tasks and cfg.train.steps > 0:
        raise ConfigError("data.train: no training tasks are left once the questions of data.eval are removed (every "
                          "train question is also a held-out one); point data.train and data.eval at different files "
                          "or splits")
    return train_tasks, eval_tasks


def split_validation(train_tasks: list[Task], n: int, seed: int) -> tuple[list[Task], list[Task]]:
    """``n`` tasks drawn (seeded) from the training tasks as a validation split, and the rest to train
    on: the validation split comes from the training distribution and never trains."""
    if n >= len(train_tasks):
        raise ConfigError(f"train.keep_best.n: {n} validation tasks leave none of the {len(train_tasks)} training "
                          f"tasks to train on; lower it or give data.train more tasks")
    picked = set(random.Random(f"validation-{seed}").sample(range(len(train_tasks)), n))
    return ([t for i, t in enumerate(train_tasks) if i not in picked],
            [t for i, t in enumerate(train_tasks) if i in picked])
