"""Where each thread of a profiled run spent its time: a summary of a py-spy raw file.

    py-spy record --subprocesses --idle --threads -r 100 -f raw -o spy.txt -- python3 benchmarks/bench_async.py ...
    python3 benchmarks/spy_threads.py spy.txt [FILTER]

Per thread: samples, the active ones (not waiting on a lock, a condition, a queue or a selector),
the masrl frames they were in (inclusive) and the leaves. FILTER keeps only stacks holding it
(``child``: the benchmark's measuring process, not its parent).
"""

from __future__ import annotations

import collections
import sys

IDLE = ("select (selectors", "Condition.wait", "Event.wait", "sleep", "_worker (concurrent/futures/thread.py:8",
        "Queue.get", "lock.acquire", "_wait_for_tstate_lock")


def main(path: str, want: str = "") -> None:
    total, idle = collections.Counter(), collections.Counter()
    inc: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    leaf: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in open(path):
        stack, _, n = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        at = next((i for i, f in enumerate(frames) if f.startswith("thread (")), None)
        if at is None or (want and want not in stack):
            continue
        thread, body, k = frames[at], frames[at + 1:], int(n)
        total[thread] += k
        if not body or any(i in body[-1] for i in IDLE):
            idle[thread] += k
            continue
        for f in set(body):
            inc[thread][f] += k
        leaf[thread][body[-1]] += k
    top = max(total.values(), default=0)
    for thread, n in total.most_common(12):
        active = n - idle[thread]
        print(f"== {thread}: {n} samples, active {active}")
        if active < 0.02 * top:
            continue
        for f, m in inc[thread].most_common(40):
            if "masrl" in f or "bench" in f or m > 0.2 * active:
                print(f"   {m:6d} {f[:130]}")
        print("   -- leaves")
        for f, m in leaf[thread].most_common(12):
            print(f"   {m:6d} {f[:130]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
