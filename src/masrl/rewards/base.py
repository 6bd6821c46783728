"""RewardAllocator protocol and the reward combination step.

Allocators are user code (``module:factory`` plugins), so ``combine`` runs each one under a time limit and
checks what it returns: a plugin in worker processes that are killed at the limit (``isolated.py``), a
built-in on a thread of its own. An allocator that runs past the limit (a stuck judge, a deadlock, a regex
that holds the GIL), raises, assigns to a call that is not in the trace, or returns a reward that is not a
finite real number within ``MAX_REWARD`` fails that trace with ``RewardFailure``, whose message names the
allocator and the task; the trace is dropped from training and counted like any failed trace
(``rollout.max_failed_fraction``). Python's and NumPy's numbers are all rewards.
"""

from __future__ import annotations

import math
import numbers
import sys
import threading
import traceback
from collections import defaultdict
from typing import Any, Callable, Protocol

from masrl.data.tasks import Task
from masrl.errors import InfraError
from masrl.trace import RewardAssignment, Trace

DEFAULT_TIMEOUT_S = 120.0
MAX_REWARD = 1e6  # a reward's magnitude past this is refused (it would swamp every advantage it meets)
_reported: dict[int, Any] = {}  # id -> allocator whose traceback was printed once already (kept: ids stay unique)


class RewardAllocator(Protocol):
    name: str

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]: ...


class RewardFailure(InfraError):
    """A reward allocator that timed out, raised, or returned something that is not a reward for a call of
    the trace: that trace fails (dropped from training, counted)."""


def run_limited(fn: Callable[[], Any], timeout_s: float | None) -> tuple[bool, Any]:
    """``fn()`` on a daemon thread of its own, waited for at most ``timeout_s`` (None: for ever).
    Returns ``(True, result)``, ``(False, exception)`` if it raised, or raises ``TimeoutError``; a thread
    past its limit is abandoned (a daemon: it never holds the process open)."""
    box: dict[str, Any] = {}

    def work():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: B036 - handed back to the caller, which decides
            box["error"] = exc

    t = threading.Thread(target=work, daemon=True, name="masrl-reward")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise TimeoutError
    return ("error" not in box), box.get("error", box.get("value"))


def _name(alloc) -> str:
    return getattr(alloc, "name", type(alloc).__name__)


def _all_allocations(trace: Trace, task: Task, allocators: list, timeout_s: float | None) -> list[tuple[str, list]]:
    """Every allocator's assignments, ``(name, list)``, in config order: the built-ins on one thread under one
    time limit, each isolated plugin in its worker processes under its own."""
    here = [a for a in allocators if not getattr(a, "isolated", False)]
    done = iter(_thread_allocations(trace, task, here, timeout_s) if here else [])
    return [next(done) if not getattr(alloc, "isolated", False) else (_name(alloc), _isolated_allocation(alloc, trace, task))
            for alloc in allocators]


def _isolated_allocation(alloc, trace: Trace, task: Task) -> list:
    from masrl.rewards.isolated import WorkerError

    where = f"reward allocator '{_name(alloc)}' on task {task.id} (trace {trace.trace_id})"
    try:
        return list(alloc.allocate(trace, task))
    except TimeoutError:
        raise RewardFailure(f"{where} did not return within {alloc.timeout_s:g} s (rollout.reward_timeout_s); its "
                            f"worker process was stopped") from None
    except WorkerError as exc:
        if exc.infra:
            raise RewardFailure(f"{where}: {exc.message}") from None
        if exc.trace_text and _first_failure(alloc):
            print(f"[masrl] {where} raised {exc.kind}: {exc.message} (the trace fails; its traceback, printed once "
                  f"per allocator, follows)\n{exc.trace_text}", file=sys.stderr, end="")
        raise RewardFailure(f"{where} raised {exc.kind}: {exc.message}") from None


def _thread_allocations(trace: Trace, task: Task, allocators: list, timeout_s: float | None) -> list[tuple[str, list]]:
    """The allocators' assignments, all run on one thread under one time limit; a failure names the
    allocator that was running."""
    running: dict[str, Any] = {"name": "", "alloc": None}

    def work():
        out = []
        for alloc in allocators:
            running["name"], running["alloc"] = _name(alloc), alloc
            got = alloc.allocate(trace, task)
            try:
                out.append((running["name"], list(got)))
            except TypeError:
                raise _NotAList(type(got).__name__) from None
        return out

    try:
        ok, got = run_limited(work, timeout_s)
    except TimeoutError:
        raise RewardFailure(f"reward allocator '{running['name']}' on task {task.id} (trace {trace.trace_id}) did "
                            f"not return within {timeout_s:g} s (rollout.reward_timeout_s)") from None
    if ok:
        return got
    where = f"reward allocator '{running['name']}' on task {task.id} (trace {trace.trace_id})"
    if isinstance(got, _NotAList):
        raise RewardFailure(f"{where} returned {got}, not a list of RewardAssignment")
    if isinstance(got, InfraError):  # a reward service (a judge) failed: already its own kind
        raise got
    if _first_failure(running["alloc"]):  # the first traceback of each allocator, under a line that names it
        print(f"[masrl] {where} raised {type(got).__name__}: {got} (the trace fails; its traceback, printed once "
              f"per allocator, follows)", file=sys.stderr)
        traceback.print_exception(got, file=sys.stderr)
    raise RewardFailure(f"{where} raised {type(got).__name__}: {got}") from got


def _first_failure(alloc) -> bool:
    """Whether ``alloc``'s failure is its first (by identity: a dataclass allocator is not hashable)."""
    if id(alloc) in _reported:
        return False
    _reported[id(alloc)] = alloc
    return True


def _as_reward(value) -> float | None:
    """A finite real number within ``MAX_REWARD`` as a float (Python's or NumPy's), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        out = float(value)
    except (OverflowError, ValueError, TypeError):  # an int too big for a float
        return None
    return out if math.isfinite(out) and abs(out) <= MAX_REWARD else None


class _NotAList(Exception):
    pass


def combine(trace: Trace, task: Task, allocators: list[RewardAllocator],
            timeout_s: float | None = DEFAULT_TIMEOUT_S) -> dict[str, float]:
    """Run every allocator (each under ``timeout_s``), sum per call, and write ``reward`` /
    ``reward_parts`` onto the calls. Returns ``{call_id: total reward}`` for the trainable calls of the
    trace; ``RewardFailure`` names the allocator whose output cannot be used."""
    parts: dict[str, dict[str, float]] = defaultdict(dict)
    known = {c.call_id for c in trace.calls}
    for name, assigned in _all_allocations(trace, task, allocators, timeout_s):
        for a in assigned:
            call_id, reward = getattr(a, "call_id", None), getattr(a, "reward", None)
            if call_id not in known:
                raise RewardFailure(f"reward allocator '{name}' on task {task.id} assigned a reward to "
                                    f"{str(call_id)[:80]!r}, which is not a call of the trace")
            value = _as_reward(reward)
            if value is None:
                shown = reward[1] if isinstance(reward, tuple) and reward[:1] == ("unreadable",) else repr(reward)[:80]
                raise RewardFailure(f"reward allocator '{name}' on task {task.id} gave call {call_id} the reward "
                                    f"{shown}; a reward must be a finite number within +-{MAX_REWARD:g}")
            source = getattr(a, "source", name)
            parts[call_id][source] = parts[call_id].get(source, 0.0) + value
    totals = {}
    for call in trace.calls:
        call.reward_parts = dict(parts.get(call.call_id, {}))
        call.reward = sum(call.reward_parts.values())
        if not math.isfinite(call.reward):
            raise RewardFailure(f"the rewards of call {call.call_id} on task {task.id} sum to {call.reward} "
                                f"({call.reward_parts}); each part must be small enough to add")
        if call.trainable:
            totals[call.call_id] = call.reward
    return totals


def combine_all(jobs: list[tuple[Trace, Task]], allocators: list[RewardAllocator],
                timeout_s: float | None = DEFAULT_TIMEOUT_S, max_threads: int = 64) -> list[dict | InfraError]:
    """``combine`` for many traces at once, each on a thread of its own (at most ``max_threads`` at a time),
    so that allocators waiting on a service overlap and the whole batch takes about one ``timeout_s`` even
    when every trace's allocator hangs. Each trace's result, or the ``InfraError`` that failed it."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        try:
            return combine(job[0], job[1], allocators, timeout_s)
        except InfraError as exc:
            return exc

    if len(jobs) <= 1:
        return [one(j) for j in jobs]
    # the pool's threads only wait (each allocator runs on a daemon thread of its own, see run_limited), so a
    # hung allocator never holds one past its limit and the pool always finishes
    with ThreadPoolExecutor(max_workers=min(max_threads, len(jobs)), thread_name_prefix="masrl-rewards") as pool:
        return list(pool.map(one, jobs))
