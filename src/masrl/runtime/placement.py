"""Placement on Ray (``runtime.placement: ray``): each model host is a Ray actor.

The driver keeps the controller, the workflows, the batchers and the reward code; every
``PolicyWorker`` runs in an actor with the CPUs and GPUs its policies ask for
(``policies.X.num_cpus`` / ``num_gpus``), one bundle per actor of one placement group. The driver
talks to an actor through ``RemoteWorker``, which has the worker's methods and passes only what
they take and return: chat messages and sampling settings in, texts and counts out, then
``{call_id: reward}`` in and metrics out. Token ids and logprobs stay in the actor that sampled
them, except where an option needs them elsewhere (``share_from``, ``train.policy_kl``).
``RemoteWorker`` counts the pickled bytes of every call's arguments and results, per method.

Only Ray places and moves: no home-made RPC. A dead actor surfaces as ``WorkerLost`` naming the
actor and the policies it hosted; checkpoints already written are left as they were.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from masrl.errors import ConfigError, MasrlError
from masrl.policies import PolicySpec
from masrl.runtime.worker import Evaluating


class WorkerLost(MasrlError):
    """A Ray actor hosting policies died or could not be reached."""


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

        from masrl.runtime.worker import PolicyWorker

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
        self.workers: list = []
        bundle = 0
        for i, ((model, specs), kwargs) in enumerate(zip(hosts, worker_kwargs)):
            b = per_host[i]
            group = []
            for r in range(ranks[i]):
                name = f"masrl-worker{i}-{'-'.join(s.name for s in specs)}" + (f"-rank{r}" if ranks[i] > 1 else "")
                actor = remote_cls.options(
                    num_cpus=b.get("CPU", 0.01), num_gpus=b.get("GPU", 0), name=name,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle),
                ).remote(model, specs, **kwargs)  # same seed on every rank: the same initial weights
                group.append(RemoteWorker(actor, specs, name))
                bundle += 1
            if len(group) > 1:
                # NCCL for the gradients on GPUs, gloo for the samples exchanged as pickled objects
                backend = "cpu:gloo,cuda:nccl" if specs[0].device.startswith("cuda") else "gloo"
                self._join(group, backend, bundle - len(group))
                self.workers.append(RankedWorker(group))
            else:
                self.workers.append(group[0])
        for w in self.workers:  # construction errors (a bad model, no GPU) surface here, by name
            w.tokenizer  # noqa: B018
        nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        for w in [r for w in self.workers for r in getattr(w, "ranks", [w])]:
            at = w.where()
            log(f"[masrl] {w.name}: node {nodes.get(at['node_id'], '?')} ({at['node_id'][:8]}), pid {at['pid']}, "
                f"GPU {', '.join(at['gpus']) or 'none'}")
        setup = sum(v[2] for w in self.workers for v in w.take_traffic().values())  # not a step's traffic
        log(f"[masrl] {len(bundles)} actor(s) ready; set-up sent {setup / 2**20:.1f} MiB to the driver (tokenizers)")

    def _join(self, group: list, backend: str, first_bundle: int) -> None:
        """Rendezvous the ranks of one data-parallel host at rank 0's node."""
        import ray
        from ray.util.placement_group import placement_group_table

        node_id = placement_group_table(self.pg)["bundles_to_node_id"][first_bundle]
        ip = next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id)
        port = group[0]._call("free_port")
        init = f"tcp://{ip}:{port}"
        futures = [w.actor.join_ranks.remote(init, r, len(group), backend) for r, w in enumerate(group)]
        ray.get(futures)

    def close(self) -> None:
        import ray

        for w in [r for w in self.workers for r in getattr(w, "ranks", [w])]:
            try:
                ray.kill(w.actor)
            except Exception:  # already gone
                pass
        try:
            ray.util.remove_placement_group(self.pg)
        except Exception:
            pass
        if self.started:
            ray.shutdown()
            loopback_only(False)


class RemoteWorker(Evaluating):
    """The driver's handle on a ``PolicyWorker`` in a Ray actor: the same methods, called remotely."""

    remote = True  # the controller updates remote workers concurrently

    def __init__(self, actor, specs: list[PolicySpec], name: str):
        self.actor, self.name = actor, name
        self.specs = {s.name: s for s in specs}
        self.policy_names = list(self.specs)
        self.trainable_names = [s.name for s in specs if s.trainable]
        self.traffic: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])  # calls, bytes out, in, seconds
        self._tokenizer = None

    def _call(self, method: str, *args, **kwargs):
        import ray

        t0 = time.perf_counter()
        sent = len(pickle.dumps((args, kwargs), protocol=5))
        try:
            out = ray.get(getattr(self.actor, method).remote(*args, **kwargs))
        except ray.exceptions.RayActorError as exc:  # ActorDiedError, ActorUnavailableError are kinds of it
            raise WorkerLost(f"Ray actor '{self.name}' hosting policy {', '.join(self.policy_names)} is gone "
                             f"({type(exc).__name__} during {method}); the run stops here. Checkpoints already "
                             f"written are intact: `masrl train CONFIG --resume` continues from the last one") from exc
        t = self.traffic[method]
        t[0] += 1
        t[1] += sent
        t[2] += len(pickle.dumps(out, protocol=5))
        t[3] += time.perf_counter() - t0
        return out

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = self._call("get_tokenizer")
        return self._tokenizer

    @property
    def step(self) -> int:
        return self._call("get_step")

    def generate(self, calls):
        return self._call("generate", calls)

    def commit_rewards(self, rewards):
        return self._call("commit_rewards", rewards)

    def drop(self, call_ids):
        return self._call("drop", call_ids)

    def advantages(self):
        return self._call("advantages")

    def train_step(self, shared=None):
        return self._call("train_step", shared)

    def rewarded(self, policies):
        return self._call("rewarded", policies)

    def score(self, policy, samples):
        return self._call("score", policy, samples)

    def park(self):
        return self._call("park")

    def save(self, directory):
        return self._call("save", directory)

    def load(self, directory, *, with_optimizer=True):
        return self._call("load", directory, with_optimizer=with_optimizer)

    def fingerprint(self, policy):
        return self._call("fingerprint", policy)

    def build_critic(self, policy, name, model, optim, seed):
        return self._call("build_critic", policy, name, model, optim, seed)

    def begin_eval(self):
        return self._call("begin_eval")

    def end_eval(self):
        return self._call("end_eval")

    def where(self):
        return self._call("where")

    def take_traffic(self) -> dict[str, list[float]]:
        """Per method: calls, bytes sent, bytes received, seconds, since the last take."""
        out = {k: list(v) for k, v in self.traffic.items()}
        self.traffic.clear()
        return out


class RankedWorker(Evaluating):
    """The ranks of one data-parallel model host, as one worker: calls are split among the ranks
    in contiguous shares, rewards go to every rank (each keeps its own calls'), and the ranks
    update together (their gradients summed over torch.distributed), so rank 0 speaks for all."""

    remote = True

    def __init__(self, ranks: list[RemoteWorker]):
        self.ranks = ranks
        self.name = ranks[0].name.rsplit("-rank", 1)[0]
        self.specs, self.policy_names, self.trainable_names = ranks[0].specs, ranks[0].policy_names, ranks[0].trainable_names
        self.pool = ThreadPoolExecutor(len(ranks), thread_name_prefix=self.name)  # one thread per rank, kept

    def _all(self, method: str, *args, **kwargs) -> list:
        return list(self.pool.map(lambda w: getattr(w, method)(*args, **kwargs), self.ranks))

    @property
    def tokenizer(self):
        return self.ranks[0].tokenizer

    @property
    def step(self) -> int:
        return self.ranks[0].step

    def generate(self, calls):
        n = len(self.ranks)
        size = -(-len(calls) // n)
        parts = [calls[i * size:(i + 1) * size] for i in range(n)]
        outs = self.pool.map(lambda wp: wp[0].generate(wp[1]) if wp[1] else [], zip(self.ranks, parts))
        return [r for out in outs for r in out]

    def commit_rewards(self, rewards):
        return sum(self._all("commit_rewards", rewards))

    def drop(self, call_ids):
        return sum(self._all("drop", call_ids))

    def advantages(self):
        out: dict = {}
        for a in self._all("advantages"):
            out.update(a)
        return out

    def train_step(self, shared=None):
        metrics = self._all("train_step", shared)
        first = metrics[0]
        for m in metrics[1:]:  # per-rank counts add up; the rest is rank 0's (identical steps on every rank)
            for p, d in m.items():
                for k in ("n_seqs", "n_tokens", "trained_tokens"):
                    if k in d and p in first:
                        first[p][k] += d[k]
        return first

    def park(self):
        self._all("park")

    def save(self, directory):
        self._all("save", directory)  # rank 0 writes the weights; other ranks only their optimizer shares

    def load(self, directory, *, with_optimizer=True):
        self._all("load", directory, with_optimizer=with_optimizer)

    def fingerprint(self, policy):
        return self.ranks[0].fingerprint(policy)

    def rewarded(self, policies):
        raise MasrlError("a data-parallel policy's calls are spread over its ranks (share_from is refused at build)")

    def score(self, policy, samples):
        raise MasrlError("a data-parallel policy's calls are spread over its ranks (policy_kl is refused at build)")

    def begin_eval(self):
        self._all("begin_eval")

    def end_eval(self):
        self._all("end_eval")

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    def take_traffic(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for w in self.ranks:
            for k, v in w.take_traffic().items():
                acc = out.setdefault(k, [0, 0, 0, 0.0])
                for j in range(4):
                    acc[j] += v[j]
        return out
