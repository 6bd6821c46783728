"""Do runs made side by side on one GPU give the numbers of the same runs made one at a time?

    python benchmarks/same_numbers.py SIDE_BY_SIDE_DIR ALONE_DIR [SIDE_DIR ALONE_DIR ...]

Each pair is one config and seed run twice: among others on a shared GPU, and alone. Per step it
compares the rollout's mean reward and each policy's loss, gradient norm and mean reward (the
numbers a run's curves are made of), and the held-out evaluations; it prints the largest
difference of each and a table of peak GPU memory per run (docs/gpu.md). Runs on a GPU are not
bit-exact run to run (atomics in attention backward, cuBLAS algorithm choice under memory
pressure), so the differences are printed, and a pair counts as the same numbers when every
difference is within ``--tol`` (default 0.02, absolute). Exit status 1 when a pair is not. Pass the
same run made twice alone as one more pair: that is the noise any side-by-side difference is to be
read against (on an H200, 12 steps of the search team alone twice differed by 0.11 in a step's
reward; docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FIELDS = ("loss", "grad_norm", "reward_mean")


def steps(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r for r in rows if "rollout" in r}


def evals(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {r["step"]: r["outcome"] for r in rows if r.get("eval") not in (None, "validation", "best")
            and "outcome" in r}


def diffs(a: Path, b: Path) -> tuple[dict[str, float], int]:
    """The largest absolute difference of each number over the steps both runs logged."""
    sa, sb = steps(a), steps(b)
    common = sorted(set(sa) & set(sb))
    out = {"reward": max((abs(sa[s]["rollout"]["reward"] - sb[s]["rollout"]["reward"]) for s in common), default=0.0)}
    for f in FIELDS:
        out[f] = max((abs(pa[f] - sb[s]["policies"][p][f]) for s in common
                      for p, pa in sa[s]["policies"].items() if f in pa and p in sb[s]["policies"]), default=0.0)
    ea, eb = evals(a), evals(b)
    out["held-out"] = max((abs(ea[s] - eb[s]) for s in set(ea) & set(eb)), default=0.0)
    return out, len(common)


def peak(run_dir: Path) -> float:
    return max((r.get("gpu_peak_gib", 0.0) for r in steps(run_dir).values()), default=0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--tol", type=float, default=0.02)
    a = ap.parse_args()
    if len(a.dirs) % 2:
        sys.exit("give the run directories in pairs: side by side, then alone")
    names = ["reward", *FIELDS, "held-out"]
    print("| side by side | alone | steps | " + " | ".join(f"max diff {n}" for n in names)
          + " | peak GiB side / alone | same numbers |")
    print("| --- " * (len(names) + 5) + "|")
    bad = 0
    for side, alone in zip(a.dirs[::2], a.dirs[1::2]):
        d, n = diffs(Path(side), Path(alone))
        same = n > 0 and all(v <= a.tol for v in d.values())
        bad += not same
        print(f"| {side} | {alone} | {n} | " + " | ".join(f"{d[k]:.4f}" for k in names)
              + f" | {peak(Path(side)):.1f} / {peak(Path(alone)):.1f} | {'yes' if same else 'NO'} |")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
