"""GPU memory of runs, from their metrics.jsonl: per run, the step with the largest peak, its peak and
reserved memory and what holds it (docs/gpu.md's table).

    python benchmarks/memory_table.py RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

PARTS = ("weights", "engine_kv", "engine_weights", "engine_buffers", "weight_copy", "optimizer")


def worst_step(run_dir: Path) -> tuple[dict, dict] | None:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "gpu_peak_gib" in r]
    if not steps:
        return None
    rec = max(steps, key=lambda r: r["gpu_peak_gib"])
    gpu = max(rec["memory"].values(), key=lambda m: m.get("peak_gib", 0.0))
    return rec, gpu


def main(dirs: list[str]) -> None:
    print("| run | step | peak GiB | reserved GiB | " + " | ".join(PARTS) + " | update adds (max over policies) |")
    print("| --- " * (5 + len(PARTS)) + "|")
    for d in dirs:
        got = worst_step(Path(d))
        if got is None:
            print(f"| {Path(d).name} | no GPU memory recorded |")
            continue
        rec, m = got
        extra = max((p.get("update_extra_gib", 0.0) for p in rec.get("policies", {}).values()), default=0.0)
        print(f"| {Path(d).name} | {rec['step']} | {m['peak_gib']:.2f} | {m['reserved_gib']:.2f} | "
              + " | ".join(f"{m.get(k, 0.0):.2f}" for k in PARTS) + f" | {extra:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
