"""A reward plugin that misbehaves, stopped or not: a run's seconds and its driver's peak RSS against a clean run.

Run: python benchmarks/bench_reward_limits.py [--steps 6] [--timeout 2]

Each row trains math/solver on tiny-random for ``--steps`` steps (4 tasks x 4 samples a step) with
``rollout.reward_timeout_s=--timeout`` and one reward plugin from tests/bad_rewards.py beside the outcome
reward: a clean one, then one that backtracks in a regex inside C (holding the GIL), one that busy-loops, one
that allocates without end. Each misbehaves on the first trace of the run only (a marker file), so that the
runs do the same work but for that trace. Both isolation modes are run: ``process`` (rewards/isolated.py: the
worker is killed at the limit) and ``thread`` (the allocator's thread is abandoned and runs on). Every run is a
child process of its own; its peak RSS is the child's (``ru_maxrss``, the driver and its in-process model),
workers not counted: sampled from /proc every 0.1 s (the driver process alone). Prints a table with the ratio of
each row's seconds and RSS to the clean run's. ``grow`` is left out of the thread rows by default
(``--thread-kinds``): under thread isolation it grows until the kernel kills the run (+23 GB on this 24 GB VM).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = textwrap.dedent('''
    """Reward plugins for the benchmark: misbehave on the run's first trace only (a marker file says it was)."""
    import os
    import re
    from masrl.trace import RewardAssignment

    def _first(marker):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    class Plugin:
        def __init__(self, weight=1.0, kind="clean", marker=""):
            self.weight, self.kind, self.marker, self.name = weight, kind, marker, kind

        def allocate(self, trace, task):
            if self.kind != "clean" and _first(self.marker):
                if self.kind == "regex":
                    re.match(r"(a+)+$", "a" * 27 + "b")  # about 2**27 steps in C, the GIL held
                elif self.kind == "busy":
                    while True:
                        pass
                elif self.kind == "grow":
                    grow = []
                    while True:
                        grow.append(bytearray(2**20))
            return [RewardAssignment(c.call_id, 0.0, self.name) for c in trace.calls]
''')


def one(kind: str, isolation: str, steps: int, timeout: float, work: Path) -> tuple[float, float, int]:
    run = work / f"{kind}-{isolation}"
    marker = work / f"{kind}-{isolation}.marker"
    args = [sys.executable, "-m", "masrl.cli", "train", "math/solver", "model=tiny-random", f"train.steps={steps}",
            "train.eval_before=false", "train.eval_after=false", "train.save_every=0", "rollout.tasks_per_step=4",
            "rollout.samples_per_task=4", "agents.solver.max_new_tokens=16", f"rollout.reward_timeout_s={timeout}",
            f"rollout.reward_isolation={isolation}", "rollout.max_failed_fraction=0.9", "threads=1",
            f"output_dir={run}", "train.stop_when_stuck=0",
            f"rewards=[{{type: outcome}}, {{type: 'bench_reward_plugin:Plugin', options: {{kind: {kind}, "
            f"marker: '{marker}'}}}}]"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(work), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0.0
    while proc.poll() is None:
        peak = max(peak, _rss_mb(proc.pid))
        time.sleep(0.1)
    took = time.perf_counter() - t0
    if proc.returncode:
        print(f"[bench] {kind}/{isolation} exited {proc.returncode}", file=sys.stderr)
    return took, peak, proc.returncode


def _rss_mb(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--timeout", type=float, default=2.0)
    ap.add_argument("--kinds", default="clean,regex,busy,grow")
    ap.add_argument("--thread-kinds", default="clean,regex,busy")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "bench_reward_plugin.py").write_text(PLUGIN)
        rows = []
        for isolation, kinds in (("process", a.kinds), ("thread", a.thread_kinds)):
            for kind in kinds.split(","):
                took, rss, rc = one(kind, isolation, a.steps, a.timeout, work)
                rows.append((kind, isolation, took, rss, rc))
    print(f"\n`python benchmarks/bench_reward_limits.py --steps {a.steps} --timeout {a.timeout:g}` on "
          f"{platform.node()} ({os.cpu_count()} cores, {platform.processor() or platform.machine()})\n")
    print("| reward plugin | isolation | run s | driver peak RSS MB | s vs clean | RSS vs clean (MB) | exit |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = {iso: (t, r) for k, iso, t, r, _ in rows if k == "clean"}
    for kind, iso, took, rss, rc in rows:
        bt, br = base.get(iso, (took, rss))
        print(f"| {kind} | {iso} | {took:.1f} | {rss:.0f} | {took / bt:.2f}x | {rss - br:+.0f} | {rc} |")


if __name__ == "__main__":
    main()
