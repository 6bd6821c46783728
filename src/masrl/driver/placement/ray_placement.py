"""Placement on Ray (``runtime.placement: ray``): each model host is a Ray actor.

The driver keeps the controller, the workflows, the batchers and the reward code; every
``PolicyWorker`` runs in an actor with the CPUs and GPUs its policies ask for
(``policies.X.num_cpus`` / ``num_gpus``), one bundle per actor of one placement group. The driver
talks to an actor through ``driver.hosts.RemoteHost`` (the host interface, each method one actor
call) and to the ranks of a data-parallel host through ``RankedHost``; what crosses is what the
interface takes and returns: chat messages and sampling settings in, texts and counts out, then
``{call_id: reward}`` in and metrics out. Token ids and logprobs stay in the actor that sampled
them, except where an option needs them elsewhere (``share_from``, ``train.policy_kl``).
``RemoteHost`` counts the pickled bytes of every call's arguments and results, per method.

Only Ray places and moves: no home-made RPC. A dead actor surfaces as ``WorkerLost`` naming the
actor and the policies it hosted; checkpoints already written are left as they were.
"""

from __future__ import annotations

import os

from masrl.driver.placement.hosts import RankedHost, RemoteHost
from masrl.errors import ConfigError
from masrl.policies import PolicySpec
from masrl.worker.interface import PolicyHost


def connect(address: str, *, cpus_needed: float, log=print) -> bool:
    """Join or start a Ray cluster; returns True when this call started a local one (to stop it
    at the end). ``auto``: the cluster ``ray start`` made on this node (or ``RAY_ADDRESS``), else a
    new local one; ``local``: always a new local one; anything else: that address."""
    try:
        import ray
    except ImportError:
        raise ConfigError("runtime.placement: ray needs Ray on every node: pip install 'masrl[ray]' "
                          "(or pip install 'ray>=2.9')") from None
    if ray.is_initialized():
        return False
    env = {"env_vars": {k: v for k, v in os.environ.items() if k.startswith(("MASRL_", "HF_", "TOKENIZERS_"))}}
    if address not in ("auto", "local"):
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        log(f"[masrl] joined the Ray cluster at {address}: {_resources(ray)}")
        return False
    if address == "auto":
        try:
            ray.init(address="auto", runtime_env=env, log_to_driver=True)
            log(f"[masrl] joined the Ray cluster on this node: {_resources(ray)}")
            return False
        except ConnectionError:
            pass
    # logical CPUs: at least what the actors ask for, so a small machine still places them
    loopback_only(True)
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(cpus_needed + 0.999)), include_dashboard=False,
             _node_ip_address="127.0.0.1", runtime_env=env, log_to_driver=True)
    log(f"[masrl] started a local Ray cluster on 127.0.0.1: {_resources(ray)}")
    return True


_LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def loopback_only(on: bool) -> None:
    """A local cluster reachable from this machine only. Ray replaces a node address of 127.0.0.1
    with the machine's external one, and its GCS, raylets and workers then listen on every
    interface, unless Ray's single-machine mode is on (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    the mode Ray uses on laptops): then they listen on 127.0.0.1 only. Ray reads the variable at
    import, so its module constant is set too; both are put back when the cluster stops."""
    from ray._private import ray_constants

    if on:
        loopback_only.saved = (os.environ.get(_LOOPBACK_ENV), ray_constants.ENABLE_RAY_CLUSTER)
        os.environ[_LOOPBACK_ENV] = "0"
        ray_constants.ENABLE_RAY_CLUSTER = False
    elif hasattr(loopback_only, "saved"):
        env, const = loopback_only.saved
        if env is None:
            os.environ.pop(_LOOPBACK_ENV, None)
        else:
            os.environ[_LOOPBACK_ENV] = env
        ray_constants.ENABLE_RAY_CLUSTER = const
        del loopback_only.saved


def _resources(ray) -> str:
    r = ray.cluster_resources()
    return f"{len(ray.nodes())} node(s), {r.get('CPU', 0):g} CPU, {r.get('GPU', 0):g} GPU"


def actor_resources(specs: list[PolicySpec]) -> dict[str, float]:
    """What one model host's actor reserves: the largest ask among its policies."""
    cpus = max(s.num_cpus for s in specs)
    gpus = max((s.num_gpus if s.num_gpus is not None else (1.0 if s.device.startswith("cuda") else 0.0))
               for s in specs)
    return {"CPU": cpus, "GPU": gpus}


class RayPlacement:
    """The actors of one run, in one placement group."""

    def __init__(self, hosts: list[tuple[str, list[PolicySpec]]], worker_kwargs: list[dict], *, strategy: str,
                 address: str, log=print, ready_timeout_s: float = 120.0):
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from masrl.worker.policy_worker import PolicyWorker

        ranks = [max(sp.data_parallel for sp in specs) for _, specs in hosts]
        per_host = [{k: v for k, v in actor_resources(specs).items() if v > 0} or {"CPU": 0.01} for _, specs in hosts]
        bundles = [b for b, n in zip(per_host, ranks) for _ in range(n)]  # one bundle per rank
        self.started = connect(address, cpus_needed=sum(b.get("CPU", 0) for b in bundles), log=log)
        self.pg = placement_group(bundles, strategy=strategy, name=f"masrl-{os.getpid()}")
        try:
            ray.get(self.pg.ready(), timeout=ready_timeout_s)
        except ray.exceptions.GetTimeoutError:
            ray.util.remove_placement_group(self.pg)
            raise ConfigError(f"runtime.placement: ray could not place {len(bundles)} actor(s) asking for {bundles} "
                              f"(strategy {strategy}) within {ready_timeout_s:.0f}s; the cluster has "
                              f"{ray.available_resources()}. Lower policies.X.num_cpus / num_gpus / data_parallel, "
                              f"add nodes, or use strategy PACK") from None
        remote_cls = ray.remote(PolicyWorker)
        self.workers: list[PolicyHost] = []  # one per model host (a data-parallel one: its ranks as one)
        self.actors: list[RemoteHost] = []  # every actor, ranks included
        bundle = 0
        for i, ((model, specs), kwargs) in enumerate(zip(hosts, worker_kwargs)):
            b = per_host[i]
            group = []
            for r in range(ranks[i]):
                name = f"masrl-worker{i}-{'-'.join(s.name for s in specs)}" + (f"-rank{r}" if ranks[i] > 1 else "")
                actor = remote_cls.options(
                    num_cpus=b.get("CPU", 0.01), num_gpus=b.get("GPU", 0), name=name,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle),
                ).remote(model, specs, name=name, **kwargs)  # same seed on every rank: the same initial weights
                group.append(RemoteHost(actor, specs, name))
                bundle += 1
            self.actors += group
            if len(group) > 1:
                # NCCL for the gradients on GPUs, gloo for the samples exchanged as pickled objects
                backend = "cpu:gloo,cuda:nccl" if specs[0].device.startswith("cuda") else "gloo"
                self._join(group, backend, bundle - len(group))
                self.workers.append(RankedHost(group))
            else:
                self.workers.append(group[0])
        for w in self.workers:  # construction errors (a bad model, no GPU) surface here, by name
            w.get_tokenizer()
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        for at in [at for w in self.workers for at in w.where()]:
            log(f"[masrl] {at['name']}: node {nodes.get(at['node_id'], '?')} ({at['node_id'][:8]}), pid {at['pid']}, "
                f"GPU {', '.join(at['gpus']) or 'none'}")
        setup = sum(v[2] for w in self.workers for v in w.take_traffic().values())  # not a step's traffic
        log(f"[masrl] {len(bundles)} actor(s) ready; set-up sent {setup / 2**20:.1f} MiB to the driver (tokenizers)")

    def _join(self, group: list, backend: str, first_bundle: int) -> None:
        """Rendezvous the ranks of one data-parallel host at rank 0's node."""
        import ray
        from ray.util.placement_group import placement_group_table

        node_id = placement_group_table(self.pg)["bundles_to_node_id"][first_bundle]
        ip = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)
        port = group[0].invoke("free_port")
        init = f"tcp://{ip}:{port}"
        futures = [w.actor.join_ranks.remote(init, r, len(group), backend) for r, w in enumerate(group)]
        ray.get(futures)

    def close(self) -> None:
        import ray

        for w in self.workers:
            w.close()
        for a in self.actors:
            try:
                ray.kill(a.actor)
            except Exception:  # already gone
                pass
        try:
            ray.util.remove_placement_group(self.pg)
        except Exception:
            pass
        if self.started:
            ray.shutdown()
            loopback_only(False)
