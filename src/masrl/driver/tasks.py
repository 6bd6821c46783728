"""Task data of a run: the training and held-out tasks its ``data`` section names."""

from __future__ import annotations

from masrl.config import DataSourceConfig, RunConfig, WorldConfig
from masrl.data import arithmetic, code_gen
from masrl.data.loader import load_math_tasks
from masrl.data.tasks import Task
from masrl.errors import ConfigError


def load_tasks(src: DataSourceConfig, *, exclude: set[str] | None = None, world: WorldConfig | None = None) -> list[Task]:
    if src.source == "qa_world":
        from masrl.data.qa_tasks import world_tasks

        world = world or WorldConfig()
        return world_tasks(src.n or 1000, seed=src.seed, world_docs=world.docs, world_seed=world.seed,
                           levels=src.levels, exclude=exclude)
    if src.source == "episodes":
        import random

        rng = random.Random(f"episodes-{src.seed}")
        seeds = [rng.getrandbits(48) for _ in range(src.n or 1000)]
        return [Task(f"ep-{src.seed}-{i}", f"episode {s}", None, {"seed": s}) for i, s in enumerate(seeds)
                if not exclude or f"episode {s}" not in exclude]
    if src.source == "arithmetic":
        return arithmetic.generate(src.n or 1000, seed=src.seed, levels=src.levels, exclude=exclude)
    if src.source == "code_gen":
        return code_gen.generate(src.n or 1000, seed=src.seed, levels=src.levels, exclude=exclude)
    if src.source == "humaneval":
        from masrl.data.code_tasks import load_humaneval

        tasks = load_humaneval()[: src.n]
    elif src.kind == "qa":
        from masrl.data.qa_tasks import load_qa_tasks

        tasks = load_qa_tasks(src.path, n=src.n)  # type: ignore[arg-type]
    elif src.kind == "code":
        from masrl.data.code_tasks import load_code_tasks

        tasks = load_code_tasks(src.path, n=src.n)  # type: ignore[arg-type]
    else:
        tasks = load_math_tasks(src.path, n=src.n)  # type: ignore[arg-type]
    if exclude:
        tasks = [t for t in tasks if t.question not in exclude]
    return tasks


def build_tasks(cfg: RunConfig) -> tuple[list[Task], list[Task]]:
    """Train and held-out tasks; generated train tasks never repeat an eval question."""
    eval_tasks = load_tasks(cfg.data.eval, world=cfg.data.world)
    train_tasks = load_tasks(cfg.data.train, exclude={t.question for t in eval_tasks}, world=cfg.data.world)
    if not train_tasks and cfg.train.steps > 0:
        raise ConfigError("data.train: no training tasks are left once the questions of data.eval are removed (every "
                          "train question is also a held-out one); point data.train and data.eval at different files "
                          "or splits")
    return train_tasks, eval_tasks
