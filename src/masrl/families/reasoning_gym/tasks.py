"""reasoning-gym's procedural datasets as a task source (``source: reasoning_gym``), scored by the library.

    data:
      train:
        source: reasoning_gym
        n: 2000
        seed: 1
        options:
          datasets:
            basic_arithmetic: {weight: 2, config: {min_terms: 2, max_terms: 2, max_digits: 1}}
            leg_counting: {config: {max_animals: 2}}
            spell_backward: {}            # the library's defaults, weight 1

Everything task-specific is the library's: its generators draw the questions (its ``composite`` dataset
mixes several by their weights, each seeded from the split's seed), and every answer is scored by the
dataset's own ``score_answer`` on the library's own entry, built with the same config (some scorers read
it). masrl adds what a run needs around that: each question once, none of the held-out questions (or the
prompts' worked examples) in training, a task per entry with the dataset's name as its ``data_source`` and
``kind`` (held-out metrics per dataset), and errors that name the key: a dataset the library does not have
(with the close names), or a config it refuses (with its message).

The worked examples (``examples`` per dataset, default 1) are the library's entries too, drawn at a seed
apart from every split and left out of both; each task carries the suite's in ``meta['examples']`` so a
workflow can show the model one of every kind of task in the answer format the library expects.
"""

from __future__ import annotations

import difflib
import functools
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from masrl.config.explain import error_lines
from masrl.data.tasks import Task
from masrl.errors import ConfigError, DataError
from masrl.families.reasoning_gym.answers import worked_answer

VERSION = "0.1.25"  # the release the shipped configs and tests were measured with (pyproject's extra pins it)
EXAMPLES_SEED = 90_210  # the worked examples' seed: not a split's (splits pass their own `seed`)
RESERVED = ("seed", "size")  # set by masrl per split; a dataset's config may not hold them
MAX_DRAWS = 20  # draw up to this many entries per task asked for before saying the config holds too few


class DatasetSpec(BaseModel):
    """One reasoning-gym dataset of a mix."""

    model_config = ConfigDict(extra="forbid")
    weight: float = Field(1.0, gt=0, description="its share of the mix (the library's composite weight)")
    config: dict[str, Any] = Field(default_factory=dict, description="the dataset's own config fields (difficulty "
                                                                     "knobs), as the library names them")


class ReasoningGymOptions(BaseModel):
    """``data.<split>.options`` of ``source: reasoning_gym``."""

    model_config = ConfigDict(extra="forbid")
    datasets: dict[str, DatasetSpec] = Field(description="dataset name -> {weight, config}; a list of names "
                                                         "takes each at its defaults, weight 1")
    examples: int = Field(1, ge=0, le=8, description="worked examples per dataset that tasks carry for prompts")

    @field_validator("datasets", mode="before")
    @classmethod
    def _names(cls, v):
        if isinstance(v, (list, tuple)):
            return {str(name): {} for name in v}
        return {k: ({} if spec is None else spec) for k, spec in v.items()} if isinstance(v, dict) else v

    @field_validator("datasets")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("name at least one reasoning-gym dataset")
        return v


def _library():
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(f"source 'reasoning_gym' needs the reasoning-gym library: pip install "
                          f"'reasoning-gym=={VERSION}' (or the package's extra: pip install -e '.[reasoning-gym]')") from None
    return reasoning_gym


def parse_options(raw: dict, key: str) -> ReasoningGymOptions:
    """The options checked against the library: every dataset exists and accepts its config."""
    try:
        opts = ReasoningGymOptions.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError("\n".join(x.strip() for x in error_lines(exc, ReasoningGymOptions, f"{key}.options"))) from None
    rg = _library()
    names = sorted(rg.factory.DATASETS)
    for name, spec in opts.datasets.items():
        at = f"{key}.options.datasets.{name}"
        if name not in rg.factory.DATASETS or name == "composite":
            close = difflib.get_close_matches(name, names, n=4, cutoff=0.6)
            raise ConfigError(f"{at}: reasoning-gym {VERSION} has no dataset '{name}'"
                              + (f"; did you mean {', '.join(close)}?" if close else "")
                              + f" ({len(names)} datasets: reasoning_gym.factory.DATASETS)")
        if reserved := [k for k in RESERVED if k in spec.config]:
            raise ConfigError(f"{at}.config.{reserved[0]}: masrl sets each split's {' and '.join(RESERVED)} "
                              f"(data.<split>.seed and n); remove it from the dataset's config")
        try:
            _dataset(name, _key(spec.config))
        except Exception as exc:  # the library's own refusal: its message, under the key that holds the config
            raise ConfigError(f"{at}.config: reasoning-gym refused {name}'s config {_key(spec.config)}: "
                              f"{type(exc).__name__}: {str(exc) or '(no message)'}") from None
    return opts


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


@functools.lru_cache(maxsize=256)
def _dataset(name: str, config_key: str, seed: int = 0, size: int = 1):
    """The library's dataset ``name`` at a config (its JSON), built once per config, seed and size."""
    return _library().create_dataset(name, seed=seed, size=size, **json.loads(config_key))


EXAMPLE_DRAWS = 8  # entries tried per worked example for one whose answer the scorer gives full marks


def _examples(opts: ReasoningGymOptions) -> tuple[dict, ...]:
    """Worked examples, ``opts.examples`` of each dataset, drawn at their own seed: the library's entries
    (``dataset``, ``question``, ``answer``, ``metadata``), each answered with what the dataset's own scorer
    gives 1.0 (``answers.worked_answer``); an entry with no such answer found is passed over."""
    out = []
    for name, spec in opts.datasets.items():
        if not opts.examples:
            continue
        size = opts.examples * EXAMPLE_DRAWS
        ds = _dataset(name, _key(spec.config), seed=EXAMPLES_SEED, size=size)
        kept = 0
        for i in range(size):
            e = ds[i]
            answer = worked_answer(ds, e)
            if answer is None:
                continue
            out.append({"dataset": name, "question": e["question"], "answer": answer, "metadata": e["metadata"]})
            kept += 1
            if kept == opts.examples:
                break
    return tuple(out)


def generate(n: int, *, seed: int, options: dict, exclude: frozenset[str] | set[str] = frozenset(),
             key: str = "data") -> list[Task]:
    """``n`` distinct tasks of the mix in ``options``, drawn by the library's composite at ``seed``; questions
    in ``exclude`` and the worked examples' are skipped (more are drawn in their place)."""
    opts = parse_options(options, key)
    rg = _library()
    from reasoning_gym.composite import DatasetSpec as RGSpec

    examples = _examples(opts)
    skip = set(exclude) | {e["question"] for e in examples}
    size = MAX_DRAWS * n + len(skip)
    mix = rg.create_dataset("composite", seed=seed, size=size,
                            datasets=[RGSpec(name, spec.weight, dict(spec.config)) for name, spec in opts.datasets.items()])
    configs = {name: dict(spec.config) for name, spec in opts.datasets.items()}
    tasks: list[Task] = []
    seen: set[str] = set()
    for idx in range(size):
        entry = mix[idx]
        q = entry["question"]
        if q in skip or q in seen:
            continue
        seen.add(q)
        name = entry["metadata"]["source_dataset"]
        meta = {"data_source": name, "kind": name, "examples": examples,
                "reasoning_gym": {"dataset": name, "config": configs[name], "metadata": entry["metadata"]}}
        tasks.append(Task(f"rg-{name}-{seed}-{idx}", q, str(entry["answer"]), meta))
        if len(tasks) >= n:
            break
    if not tasks:
        raise DataError(f"{key}: the reasoning-gym mix gave no question outside the held-out ones and the examples")
    return tasks


def is_reasoning_gym(task: Task) -> bool:
    return isinstance(task.meta.get("reasoning_gym"), dict)


def score(answer: Any, task: Task) -> float:
    """The dataset's own ``score_answer`` on the library's entry for ``task`` (0 for no answer)."""
    rg_meta = task.meta["reasoning_gym"]
    ds = _dataset(rg_meta["dataset"], _key(rg_meta["config"]))
    entry = {"question": task.question, "answer": task.answer, "metadata": rg_meta["metadata"]}
    value = ds.score_answer(None if answer is None else str(answer), entry)
    return float(value)
