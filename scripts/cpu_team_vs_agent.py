"""`make demo`: the search team against one search agent with the same search tool on a CPU,
SmolLM2-135M-Instruct, about equal training calls, then both side by side on the same held-out
questions.

    .venv/bin/python scripts/cpu_team_vs_agent.py [--seed 0] [--steps 6] [--out runs/cpu-team-vs-agent]
        [--side-by-side auto|on|off] [KEY=VALUE ...]

The team (planner, searcher, summarizer, updater, answerer on one model; 6 calls a question) trains
on 2 questions x 4 samples a step; the agent (one model that calls `search` itself, up to 3 calls,
about 1.8 on average; its prompt shows a worked example of each kind of question) on 6 x 4, so both
spend about the same model calls in training (the table prints them). KEY=VALUE overrides go to both
arms. Both are scored (token F1 against the gold answers, greedy) on 32 held-out questions before
and after. A run that finished is not run again. `--precision auto` (the default) trains in bf16 (fp32 master
weights) where the CPU has bf16 units, about 1.6x faster a step, else in fp32. What it showed (docs/results.md): in 6 CPU steps
the team is not ahead (seeds 0-2); on a GPU, 100 steps, the two end level.

`--side-by-side auto` (the default) trains the two arms at once where the machine has at least 2 cores,
each in its own process on half the cores (`threads=`), its lines prefixed with the arm's name and kept
in the run's `train.log`: on 2 cores the demo took 12.8 minutes instead of 16.3 one arm after the other
(docs/benchmarks.md). Each arm's minutes are then its own wall-clock while sharing the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from masrl.worker.precision import cpu_bf16_units

ROOT = Path(__file__).resolve().parents[1]

ARMS = {
    "search team": ("configs/search_team_shared.yaml", ["rollout.tasks_per_step=2"]),
    "one search agent": ("configs/search_agent.yaml", ["rollout.tasks_per_step=6"]),
}


def arm_command(config: str, overrides: list[str], out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "masrl.cli", "train", config, *overrides, f"output_dir={out}"]
    return [*cmd, "--resume"] if out.exists() else cmd


def run_arm(config: str, overrides: list[str], out: Path) -> float:
    """Train one arm; returns the seconds it took."""
    cmd = arm_command(config, overrides, out)
    print("$", " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    return time.perf_counter() - t0


def run_side_by_side(arms: dict[str, tuple[str, list[str], Path]]) -> dict[str, float]:
    """Train the arms at once, each in its own process; every line an arm prints is shown prefixed with
    its name and kept in its output folder's ``train.log``. Returns each arm's seconds, to its own end;
    an arm that fails stops the demo with its name, exit code and log."""
    t0, took, codes, readers = time.perf_counter(), {}, {}, []
    for name, (config, overrides, out) in arms.items():
        cmd = arm_command(config, overrides, out)
        print(f"[{name}] $", " ".join(cmd[2:]), flush=True)
        out.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        def relay(name=name, proc=proc, log=out / "train.log") -> None:
            with log.open("a") as f:
                for line in proc.stdout:
                    f.write(line)
                    f.flush()
                    print(f"[{name}] {line}", end="", flush=True)
            codes[name] = proc.wait()
            took[name] = time.perf_counter() - t0

        readers.append(threading.Thread(target=relay, daemon=True))
        readers[-1].start()
    for r in readers:
        r.join()
    failed = [f"{name} exited with {rc} (its log: {arms[name][2] / 'train.log'})" for name, rc in codes.items() if rc]
    if failed:
        raise SystemExit("[demo] " + "; ".join(failed))
    return took


def summary(out: Path) -> dict:
    before, after = (json.loads((out / f"eval_{k}.json").read_text()) for k in ("before", "after"))
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    train_calls = sum(a["calls"] for r in steps for a in r["rollout"]["agents"].values())
    per_question = sum(a["calls"] for a in after["agents"].values()) / max(1, after["traces"])
    return {"before": before["outcome"], "after": after["outcome"], "em": after.get("em", 0.0), "train_calls": train_calls,
            "per_question": per_question, "questions": after["traces"], "steps": len(steps)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default="runs/cpu-team-vs-agent")
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="auto: bf16 where this CPU has bf16 units (avx512_bf16 / amx_bf16: ~1.6x faster), else fp32")
    ap.add_argument("--side-by-side", choices=["auto", "on", "off"], default="auto",
                    help="train both arms at once, each on half the cores (auto: where there are at least 2)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both arms")
    a = ap.parse_args()
    precision = a.precision if a.precision != "auto" else ("bf16" if cpu_bf16_units() else "fp32")
    print(f"[demo] precision={precision} (bf16 weights with fp32 master weights where the CPU computes bf16 natively; "
          f"--precision fp32 for the fp32 figures)", flush=True)
    cores = os.cpu_count() or 1
    threads = max(1, cores // 2)
    together = a.side_by_side == "on" or (a.side_by_side == "auto" and cores >= 2)
    common = [f"seed={a.seed}", f"train.steps={a.steps}", "train.save_every=0", "data.eval.n=32", f"precision={precision}",
              *([f"threads={threads}"] if together else []), *a.overrides]
    arms = {name: (config, [*common, *own], ROOT / a.out / f"{name.split()[-1]}-seed{a.seed}")
            for name, (config, own) in ARMS.items()}
    todo = {name: arm for name, arm in arms.items() if not (arm[2] / "eval_after.json").is_file()}  # not run again
    took = dict.fromkeys(arms, 0.0)
    if together:
        print(f"[demo] the two arms train side by side, each on {threads} of {cores} cores "
              f"(--side-by-side off: one after the other on all of them)", flush=True)
        took.update(run_side_by_side(todo))
    else:
        took.update({name: run_arm(*arm) for name, arm in todo.items()})
    rows = {name: summary(out) for name, (_, _, out) in arms.items()}
    n = rows["search team"]["questions"]
    print(f"\nheld-out: {n} questions never trained on, token F1 of the final answer (greedy), seed {a.seed}, "
          f"{a.steps} training steps on this CPU, precision {precision}")
    minutes = "minutes (side by side)" if together else "minutes"
    print(f"| arm | F1 before -> after | exact match after | training calls | calls per question | {minutes} |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        mins = f"{took[name] / 60:.1f}" if took[name] else "(done before)"
        print(f"| {name} | {r['before']:.3f} -> **{r['after']:.3f}** | {r['em']:.3f} | {r['train_calls']} | "
              f"{r['per_question']:.1f} | {mins} |")
    team, agent = rows["search team"]["after"], rows["one search agent"]["after"]
    verdict = "ahead of" if team > agent else "not ahead of"
    print(f"\nThe trained team is {verdict} the trained single agent ({team:.3f} vs {agent:.3f}) after {a.steps} steps. "
          f"Seeds differ by about 0.1 here: compare over seeds (`--seed 1`, `--seed 2`). On a GPU, `make gpu-demo` "
          f"runs this comparison for 100 steps and 3 seeds; there the two end level (docs/results.md).")


if __name__ == "__main__":
    main()
