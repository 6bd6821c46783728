"""Advantage estimators: one registry, one signature, for masrl's and yours.

Every estimator is a function ``f(batch: EstimatorBatch, **options) -> advantages``:

- a *sequence* estimator returns ``[N]``, one advantage per call (GRPO, RLOO, REINFORCE++);
- a *token-level* estimator (``token_level=True``) returns ``[N, T]`` over ``batch.mask``;
- an estimator that needs values (``needs_critic=True``: GAE) reads ``batch.values`` (the policy's
  value head, or its separate critic, ``[N, T]``) and returns ``(advantages, returns)``, both
  ``[N, T]``; the returns are the value targets.

``options`` are the estimator's keyword arguments: the ``AlgorithmConfig`` fields it declares
(``config=("std_normalize",)`` for GRPO), then ``algorithm.advantage_options`` over them.

Built-ins are listed here by name; your own is ``algorithm.advantage: 'module:function'``, a
function with this signature, marked with ``@estimator(...)`` when it is token-level or needs a
critic (unmarked: a sequence estimator). Which passes the trainer runs (values, a reference
model) is decided here once: ``needs_critic`` and ``needs_reference``. This module imports no
torch; the functions are imported when first used.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from masrl.config.loading import load_object
from masrl.errors import ConfigError

if TYPE_CHECKING:
    import torch


@dataclass
class EstimatorBatch:
    """What an estimator sees: one policy's rewarded calls of one update (or every rank's, under
    data parallelism)."""

    rewards: "torch.Tensor"  # [N] float64, after algorithm.reward_norm
    group_ids: "torch.Tensor"  # [N] long: calls with equal algorithm.group_key share an id
    mask: "torch.Tensor"  # [N, T] 1.0 on each call's completion tokens
    values: "torch.Tensor | None" = None  # [N, T] value estimates (needs_critic only)
    keys: list[dict] = field(default_factory=list)  # each call's task_id, agent, turn, sample_idx
    state: dict = field(default_factory=dict)  # the estimator's own, kept per policy across updates and saved with
    # the checkpoint (JSON values): e.g. RAE's running baseline per role


@dataclass(frozen=True)
class Estimator:
    name: str
    fn: Callable[..., Any]
    needs_critic: bool = False
    token_level: bool = False
    config: tuple[str, ...] = ()  # AlgorithmConfig fields passed as keyword options


def estimator(*, needs_critic: bool = False, token_level: bool = False, config: tuple[str, ...] = ()):
    """Mark a function as an estimator of the given kind (for ``'module:function'`` plugins and
    built-ins alike). ``needs_critic`` implies ``token_level``."""

    def mark(fn):
        fn.masrl_estimator = {"needs_critic": needs_critic, "token_level": token_level or needs_critic,
                              "config": tuple(config)}
        return fn

    return mark


# name -> 'module:function' of a built-in (imported on first use; the traits are on the function)
BUILTINS: dict[str, str] = {
    "grpo": "masrl.algorithms.grpo:grpo_estimator",
    "rloo": "masrl.algorithms.rloo:rloo_estimator",
    "reinforce_pp": "masrl.algorithms.reinforce_pp:reinforce_pp_estimator",
    "gae": "masrl.algorithms.gae:gae_estimator",
    "rae": "masrl.algorithms.rae:rae_estimator",
}
BUILTIN_NEEDS_CRITIC = frozenset({"gae"})  # known without importing torch (config validation)

_resolved: dict[str, Estimator] = {}


def _import(ref: str, what: str):
    if ref in BUILTINS.values():
        mod, attr = ref.split(":")
        return getattr(importlib.import_module(mod), attr)
    return load_object(ref, what)


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``, or the ``'module:function'`` it names."""
    if name in _resolved:
        return _resolved[name]
    if name not in BUILTINS and ":" not in name:
        raise ConfigError(f"algorithm.advantage: unknown advantage estimator {name!r}: use "
                          f"{', '.join(BUILTINS)} or 'module:function'")
    fn = _import(BUILTINS.get(name, name), "algorithm.advantage")
    if not callable(fn):
        raise ConfigError(f"algorithm.advantage: '{name}' is not a function")
    traits = getattr(fn, "masrl_estimator", {})
    est = Estimator(name, fn, **traits)
    _resolved[name] = est
    return est


def estimator_options(est: Estimator, algo) -> dict[str, Any]:
    """The keyword options ``est`` is called with; a key it does not take is an error naming it."""
    options = {k: getattr(algo, k) for k in est.config}
    options.update(algo.advantage_options)
    params = inspect.signature(est.fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = [k for k in algo.advantage_options if k not in params]
        if unknown:
            takes = [k for k, p in params.items() if p.kind is p.KEYWORD_ONLY or p.default is not p.empty]
            raise ConfigError(f"algorithm.advantage_options: {', '.join(unknown)} is not an option of estimator "
                              f"'{est.name}' (it takes: {', '.join(takes) or 'none'})")
    return options


def needs_critic(algo) -> bool:
    """Whether ``algo``'s estimator reads values (a value head or a separate critic)."""
    if algo.advantage in BUILTINS:
        return algo.advantage in BUILTIN_NEEDS_CRITIC
    return get_estimator(algo.advantage).needs_critic


def needs_reference(algo) -> bool:
    """Whether the trainer keeps a reference model (a KL term in the loss)."""
    return algo.kl_coef > 0


def check_estimator(algo) -> Estimator:
    """Resolve ``algo``'s estimator and its options at build time, so a bad name, object or option
    stops the run before any model loads."""
    est = get_estimator(algo.advantage)
    estimator_options(est, algo)
    return est
