"""A user's reward allocator in worker processes the run can stop.

A thread cannot be stopped: an allocator stuck in code that holds the GIL (a backtracking regex) kept its
time limit from firing at all, and one that busy-looped or allocated for ever went on doing so after its
trace was failed, slowing or growing the run for good. ``IsolatedAllocator`` runs a ``module:factory``
reward in spawned worker processes (``rollout.reward_isolation: process``, the default for plugins; the
built-in rewards stay in the run's process): a call past ``rollout.reward_timeout_s`` has its worker killed
and replaced, and each worker's address space is capped at ``rollout.reward_memory_mb``, so an allocation
without end is a ``MemoryError`` in that trace alone.

What crosses: the trace and the task go to the worker pickled; what comes back is a list of
``(call_id, reward, source)`` with each reward as a plain number where it is one (a NumPy scalar is sent as
its float), or an error with its type, message and traceback text. A worker builds its allocator once
from the config (``factory(weight=..., **options)``) and serves one trace at a time.
"""

from __future__ import annotations

import numbers
import os
import queue
import threading
import traceback
from dataclasses import dataclass
from typing import Any

from masrl.errors import InfraError
from masrl.trace import RewardAssignment

SPAWN_TIMEOUT_S = 120.0  # a worker that has not built its allocator by then is a failure, named as such


@dataclass(frozen=True)
class WorkerSpec:
    ref: str  # module:factory
    weight: float
    options: dict
    memory_mb: int | None


class WorkerError(Exception):
    """What a worker sent back instead of assignments: the allocator's own exception, re-raised by type name."""

    def __init__(self, kind: str, message: str, trace_text: str, infra: bool):
        super().__init__(message)
        self.kind, self.message, self.trace_text, self.infra = kind, message, trace_text, infra

    def __str__(self) -> str:
        return self.message


def _wire(value: Any) -> Any:
    """A reward as it crosses: Python's own numbers as they are (the run checks them), any other real number
    (NumPy's) as its float, anything else as its ``repr`` for the error message."""
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, numbers.Real):
        try:
            return float(value)
        except (OverflowError, ValueError):
            return ("unreadable", repr(value)[:80])
    return ("unreadable", f"{type(value).__name__} {repr(value)[:80]}")


def _cap_memory(memory_mb: int | None) -> None:
    if not memory_mb:
        return
    try:
        import resource

        cap = int(memory_mb) * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (ImportError, ValueError, OSError):  # no such limit here: the time limit still holds
        pass


def _serve(conn, spec: WorkerSpec) -> None:
    """The worker: build the allocator, then answer one ``(trace, task)`` at a time until the pipe closes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    _cap_memory(spec.memory_mb)
    try:
        from masrl.config.loading import load_object

        alloc = load_object(spec.ref, "reward")(weight=spec.weight, **spec.options)
        conn.send(("ready", getattr(alloc, "name", type(alloc).__name__)))
    except BaseException as exc:  # noqa: B036 - the parent names it
        conn.send(("error", type(exc).__name__, str(exc)[:500], traceback.format_exc(), False))
        return
    while True:
        try:
            trace, task = conn.recv()
        except (EOFError, OSError):
            return
        try:
            got = alloc.allocate(trace, task)
            out = [(getattr(a, "call_id", None), _wire(getattr(a, "reward", None)), getattr(a, "source", None))
                   for a in got]
            conn.send(("ok", out))
        except BaseException as exc:  # noqa: B036 - the trace fails with it; the worker serves on
            infra = isinstance(exc, InfraError)
            conn.send(("error", type(exc).__name__, str(exc)[:500], traceback.format_exc(), infra))


class _Worker:
    def __init__(self, spec: WorkerSpec):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")  # never fork the trainer (threads, a GPU context)
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, spec), daemon=True, name="masrl-reward-worker")
        self.proc.start()
        child.close()
        if not self.conn.poll(SPAWN_TIMEOUT_S):
            self.kill()
            raise WorkerError("TimeoutError", f"its worker did not start within {SPAWN_TIMEOUT_S:g} s", "", True)
        msg = self.conn.recv()
        if msg[0] != "ready":
            self.kill()
            raise WorkerError(msg[1], f"building it in its worker raised {msg[1]}: {msg[2]}", msg[3], False)

    def call(self, trace, task, timeout_s: float | None) -> list:
        try:
            self.conn.send((trace, task))
            ready = self.conn.poll(timeout_s)
            msg = self.conn.recv() if ready else None
        except (EOFError, OSError, BrokenPipeError):
            self.kill()
            raise WorkerError("WorkerLost", f"its worker died (exit code {self.proc.exitcode}; past "
                                            f"rollout.reward_memory_mb, or killed)", "", True) from None
        if msg is None:
            self.kill()  # stopped at its limit, whatever it was doing
            raise TimeoutError
        if msg[0] == "ok":
            return msg[1]
        raise WorkerError(msg[1], msg[2], msg[3], msg[4])

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()


class IsolatedAllocator:
    """A ``module:factory`` allocator that runs in up to ``workers`` spawned processes, started as needed;
    ``allocate`` blocks for a free worker, then at most ``timeout_s`` for its answer (``TimeoutError``: the
    worker was killed; the next call starts another)."""

    isolated = True

    def __init__(self, ref: str, *, weight: float, options: dict, name: str, timeout_s: float | None,
                 memory_mb: int | None, workers: int):
        self.name, self.ref, self.timeout_s = name, ref, timeout_s
        self.spec = WorkerSpec(ref, weight, dict(options), memory_mb)
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(max(1, workers))
        self._all: list[_Worker] = []
        self._lock = threading.Lock()

    def allocate(self, trace, task) -> list[RewardAssignment]:
        with self._slots:
            worker = self._take()
            try:
                got = worker.call(trace, task, self.timeout_s)
            except BaseException:
                if not worker.alive:
                    self._forget(worker)
                else:
                    self._idle.put(worker)
                raise
            self._idle.put(worker)
        return [RewardAssignment(call_id, reward, source or self.name) for call_id, reward, source in got]

    def _take(self) -> _Worker:
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            worker = _Worker(self.spec)
            with self._lock:
                self._all.append(worker)
            return worker

    def _forget(self, worker: _Worker) -> None:
        with self._lock:
            if worker in self._all:
                self._all.remove(worker)

    def close(self) -> None:
        """Stop every worker (the run is over)."""
        with self._lock:
            workers, self._all = list(self._all), []
        for w in workers:
            w.kill()
        while not self._idle.empty():
            self._idle.get_nowait()

    def __del__(self):  # a run that never closed its allocators leaves no worker behind
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass
