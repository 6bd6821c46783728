"""The driver's handles on hosts in other processes, generated from ``worker.interface``.

``RemoteHost`` stands for a ``PolicyWorker`` in a Ray actor: each interface method becomes one
actor call, its pickled arguments and results counted per method (``take_traffic``), a dead
actor turned into ``WorkerLost``. ``RankedHost`` stands for the ranks of one data-parallel host
and runs each method as the interface declares (``split`` the calls among the ranks, ``all``
ranks with the same arguments, rank 0 ``first``, or ``refuse``), combining the answers with the
method's own ``combine``. Neither class writes a method out by hand: a method added to the
interface reaches both. Ray is imported only when a call is made.
"""

from __future__ import annotations

import abc
import pickle
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from masrl.errors import MasrlError, WorkerLost
from masrl.worker.interface import METHODS, PolicyHost


def _generated(make):
    """Class decorator: every interface method the class body does not define is made by
    ``make(method)``; then the class is no longer abstract."""

    def apply(cls):
        for m in METHODS.values():
            if m.name not in cls.__dict__:
                fn = make(m)
                fn.__name__, fn.__qualname__ = m.name, f"{cls.__name__}.{m.name}"
                fn.__doc__ = getattr(PolicyHost, m.name).__doc__
                setattr(cls, m.name, fn)
        abc.update_abstractmethods(cls)
        return cls

    return apply


def _forward(m):
    def method(self, *args, **kwargs):
        return self.invoke(m.name, *args, **kwargs)

    return method


@_generated(_forward)
class RemoteHost(PolicyHost):
    """A ``PolicyWorker`` in a Ray actor, called through ``invoke``."""

    separate_process = True  # the controller updates such hosts concurrently

    def __init__(self, actor, specs: list, name: str):
        self.actor, self.name = actor, name
        self.specs = {s.name: s for s in specs}
        self.policy_names = list(self.specs)
        self.trainable_names = [s.name for s in specs if s.trainable]
        self.traffic: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])  # calls, bytes out, in, seconds
        self._tokenizer = None

    def invoke(self, method: str, *args, **kwargs):
        """Call ``method`` on the actor and wait for it (set-up methods beyond the interface too:
        ``free_port``, ``join_ranks``)."""
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

    def get_tokenizer(self):
        if self._tokenizer is None:  # asked once: it does not change
            self._tokenizer = self.invoke("get_tokenizer")
        return self._tokenizer

    def take_traffic(self) -> dict[str, list[float]]:
        out = {k: list(v) for k, v in self.traffic.items()}
        self.traffic.clear()
        return out

    def close(self) -> None:
        return None  # the placement kills its actors


def _fan_out(m):
    def method(self, *args, **kwargs):
        return self.run(m, *args, **kwargs)

    return method


@_generated(_fan_out)
class RankedHost(PolicyHost):
    """The ranks of one data-parallel host, as one host. Rewards go to every rank (each keeps its
    own calls'), and the ranks update together (their gradients summed over torch.distributed),
    so rank 0 speaks for all where one answer is enough."""

    separate_process = True

    def __init__(self, ranks: list[PolicyHost]):
        self.ranks = ranks
        self.name = ranks[0].name.rsplit("-rank", 1)[0]
        self.specs, self.policy_names = ranks[0].specs, ranks[0].policy_names
        self.trainable_names = ranks[0].trainable_names

    def run(self, m, *args, **kwargs):
        """Run interface method ``m`` on the ranks as it declares. Each call gets threads of its own,
        one per rank: with asynchronous rollouts an update (whose ranks wait for each other in a
        collective) and a generation run at once, and a shared pool of one thread per rank could
        hand both of one rank's calls the threads while another rank's part of the update waits."""
        if m.fan_out == "first":
            return getattr(self.ranks[0], m.name)(*args, **kwargs)
        if m.fan_out == "refuse":
            raise MasrlError(f"{m.name}: a data-parallel policy's calls are spread over its ranks (the options that "
                             f"need it, share_from and train.policy_kl, are refused at build)")
        if m.fan_out == "split":
            items, n = args[0], len(self.ranks)
            size = -(-len(items) // n)
            parts = [items[i * size:(i + 1) * size] for i in range(n)]
            jobs = [lambda r=r, part=part: getattr(r, m.name)(part, *args[1:], **kwargs) if part else []
                    for r, part in zip(self.ranks, parts)]
        else:
            jobs = [lambda r=r: getattr(r, m.name)(*args, **kwargs) for r in self.ranks]
        with ThreadPoolExecutor(len(jobs), thread_name_prefix=f"{self.name}-{m.name}") as pool:
            return m.combine(list(pool.map(lambda job: job(), jobs)))

    def close(self) -> None:
        for r in self.ranks:
            r.close()
