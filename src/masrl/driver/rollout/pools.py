"""Opponent pools: frozen policies that take turns receiving a snapshot of the policy they trail.

Every policy with ``snapshot_of: P`` belongs to P's pool (in config order). Each ``snapshot_every`` steps the
next member in turn, the one holding the oldest snapshot, is given P's weights as they are at that step (saved
weights-only to a temporary folder inside the run directory, loaded into the member's host, published to its
engine). A pool starts with every member at the model's start, so its distinct members grow from one to all of
them as the run goes on (a league of the policy's own past); a checkpoint saves the members' weights, so a
resumed run keeps its pool.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def pools_of(cfg) -> dict[tuple[str, int], list[str]]:
    """``(source policy, every)`` -> its members, in config order."""
    out: dict[tuple[str, int], list[str]] = {}
    for name, p in cfg.policies.items():
        if p.snapshot_of:
            out.setdefault((p.snapshot_of, p.snapshot_every), []).append(name)
    return out


def _copy(host_of: dict, source: str, members: list[str], run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="snapshot-", dir=run_dir) as d:
        host_of[source].save(d, weights_only=True)
        for member in members:
            host_of[member].load_weights(member, str(Path(d) / source))


def load_initial(cfg, workers) -> list[str]:
    """Policies with ``init_from`` take those weights (a fresh run's start); the names of those that did."""
    from masrl.errors import ConfigError

    host_of = {name: w for w in workers for name in w.policy_names}
    done = []
    for name, p in cfg.policies.items():
        if p.init_from:
            folder = Path(p.init_from).expanduser()
            if not (folder / "model.safetensors").is_file():
                raise ConfigError(f"policies.{name}.init_from: {folder} holds no model.safetensors (give a policy's "
                                  f"folder in a checkpoint, e.g. runs/R/checkpoints/best/{name})")
            host_of[name].load_weights(name, str(folder))
            done.append(name)
    return done


def start(cfg, workers, run_dir: Path) -> None:
    """Every member takes its source's starting weights (a pretrained model's anyway; random-weight models are
    drawn per host)."""
    host_of = {name: w for w in workers for name in w.policy_names}
    for (source, _), members in pools_of(cfg).items():
        _copy(host_of, source, members, run_dir)


def refresh(cfg, workers, step: int, run_dir: Path) -> dict[str, str]:
    """At ``step``, the members whose turn it is take their source's weights; ``{member: source}`` of those."""
    host_of = {name: w for w in workers for name in w.policy_names}
    done = {}
    for (source, every), members in pools_of(cfg).items():
        if step % every:
            continue
        member = members[(step // every - 1) % len(members)]
        _copy(host_of, source, [member], run_dir)
        done[member] = source
    return done
