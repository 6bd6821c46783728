"""`make demo`: a team against the single agents it is measured against, with the same tool, on a CPU,
SmolLM2-135M-Instruct, about equal training calls, then all side by side on the same held-out tasks.

    .venv/bin/python scripts/cpu_team_vs_agent.py [--family chain|chain-stepwise|search] [--seed 0] [--steps 8]
        [--out runs/cpu-team-vs-agent] [--side-by-side auto|on|off] [KEY=VALUE ...]

``--family chain`` (the default): problems that chain 3-4 events on one count ("Ana has 14 apples. Then Ana
buys 3 packs with 5 in each pack. Then Ana gives away 9. ..."). The team (math/chain_team) is one
stepper per event, each shown only the count so far and its event, the calculator computing each step. Two
single agents with the same calculator: the strongest one, a solver that works through the same events in one
conversation (math/chain_stepwise), a turn and a calculator call per event (the team's calls and information),
and the classic one, a solver that writes one expression for the whole chain (math/chain_agent), with a worked
chain of every kind of event in its prompt. Team and stepwise solver 3 problems x 4 samples a step (3.5 calls a
problem), the one-expression solver 11 x 4, so all spend about the same model calls (the table prints them).
All are scored on 32 held-out problems (accuracy, greedy) before and after training, and at the best
checkpoint chosen fairly (``train.keep_best``: 32 training problems held back from training score the weights
every 2 steps; the held-out set never chooses), printed beside the last step's. The verdict compares the team
with the stronger single agent.

``--family search``: the search team (planner, searcher, summarizer, updater, answerer; 6 calls a question)
against one search agent with the same BM25 tool, 6 steps unless ``--steps`` says otherwise, token F1 on 32
held-out questions; there the team is not ahead after 6 CPU steps, and on a GPU the two end level
(docs/results.md).

KEY=VALUE overrides go to both arms. A run that finished is not run again. ``--precision auto`` (the default)
trains in bf16 (fp32 master weights) where the CPU has bf16 units, about 1.6x faster a step, else in fp32.
``--side-by-side auto`` (the default) trains the arms at once where the machine has at least 2 cores,
each in its own process on its share of the cores (``threads=``), its lines prefixed with the arm's name and
kept in the run's ``train.log``. Each arm's minutes are then its own wall-clock while sharing the machine.
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
# train.keep_best for every arm: validation tasks held back from training, and how often they score the weights;
# the held-out set is scored at the weights they pick beside the last step's
KEEP_N, KEEP_EVERY = 32, 2

# each family: its two arms (name: folder, config, own overrides; the team first), what is scored, the default
# steps. An arm's folder is ``<folder>-seed<S>``: the chain families share the team's, so running
# ``--family chain-stepwise`` into the same ``--out`` after ``--family chain`` trains only the new single agent.
_CHAIN_TEAM = ("team", "math/chain_team", ["rollout.tasks_per_step=3"])
_CHAIN = {"scored": "accuracy of the final answer (greedy)", "tasks": "problems", "steps": 8}
FAMILIES = {
    "chain": {"arms": {"chained-math team": _CHAIN_TEAM,
                       "one solver, a turn per event": ("stepwise", "math/chain_stepwise", ["rollout.tasks_per_step=3"]),
                       "one solver, one expression": ("agent", "math/chain_agent", ["rollout.tasks_per_step=11"])},
              **_CHAIN, "more": "docs/results.md has these runs over seeds, and on a GPU"},
    "search": {"arms": {"search team": ("team", "qa/search_team_shared", ["rollout.tasks_per_step=2"]),
                        "one search agent": ("agent", "qa/search_agent", ["rollout.tasks_per_step=6"])},
               "scored": "token F1 of the final answer (greedy)", "tasks": "questions", "steps": 6,
               "more": "on a GPU, `make gpu-demo` runs this comparison for 100 steps and 3 seeds; there the two "
                      "end level (docs/results.md)"},
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


def folder(kind: str, seed: int) -> str:
    """An arm's output folder: ``team-seed0`` for the team, ``agent-seed0`` (or ``stepwise-seed0``) for the
    single agent."""
    return f"{kind}-seed{seed}"


def summary(out: Path) -> dict:
    before, after = (json.loads((out / f"eval_{k}.json").read_text()) for k in ("before", "after"))
    best_file = out / "eval_best.json"  # train.keep_best: the held-out figures at the best-by-validation weights
    best = json.loads(best_file.read_text()) if best_file.is_file() else None
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"rollout"' in x]
    train_calls = sum(a["calls"] for r in steps for a in r["rollout"]["agents"].values())
    per_question = sum(a["calls"] for a in after["agents"].values()) / max(1, after["traces"])
    return {"before": before["outcome"], "after": after["outcome"], "em": after.get("em", 0.0), "train_calls": train_calls,
            "per_question": per_question, "questions": after["traces"], "steps": len(steps),
            "best": None if best is None else (best["outcome"], best["best_step"])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", choices=sorted(FAMILIES), default="chain",
                    help="chain: chained math problems, the team against one solver taking a turn per event and one "
                         "writing one expression (the default); search: the search team and one search agent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the family's, 8 or 6)")
    ap.add_argument("--out", default="runs/cpu-team-vs-agent")
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="auto: bf16 where this CPU has bf16 units (avx512_bf16 / amx_bf16: ~1.6x faster), else fp32")
    ap.add_argument("--side-by-side", choices=["auto", "on", "off"], default="auto",
                    help="train the arms at once, each on its share of the cores (auto: where there are at least 2)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both arms")
    a = ap.parse_args()
    fam = FAMILIES[a.family]
    a.steps = a.steps or fam["steps"]
    precision = a.precision if a.precision != "auto" else ("bf16" if cpu_bf16_units() else "fp32")
    print(f"[demo] precision={precision} (bf16 weights with fp32 master weights where the CPU computes bf16 natively; "
          f"--precision fp32 for the fp32 figures)", flush=True)
    cores = os.cpu_count() or 1
    threads = max(1, cores // len(fam["arms"]))
    together = a.side_by_side == "on" or (a.side_by_side == "auto" and cores >= 2)
    common = [f"seed={a.seed}", f"train.steps={a.steps}", "train.save_every=0", "data.eval.n=32", f"precision={precision}",
              f"train.keep_best.n={KEEP_N}", f"train.keep_best.every={KEEP_EVERY}",
              *([f"threads={threads}"] if together else []), *a.overrides]
    arms = {name: (config, [*common, *own], ROOT / a.out / folder(kind, a.seed))
            for name, (kind, config, own) in fam["arms"].items()}
    todo = {name: arm for name, arm in arms.items() if not (arm[2] / "eval_after.json").is_file()}  # not run again
    took = dict.fromkeys(arms, 0.0)
    if together:
        print(f"[demo] the {len(todo)} arms train side by side, {threads} thread(s) each on {cores} cores "
              f"(--side-by-side off: one after the other on all of them)", flush=True)
        took.update(run_side_by_side(todo))
    else:
        took.update({name: run_arm(*arm) for name, arm in todo.items()})
    rows = {name: summary(out) for name, (_, _, out) in arms.items()}
    team_name, *agent_names = fam["arms"]
    n, tasks = rows[team_name]["questions"], fam["tasks"]
    print(f"\nheld-out: {n} {tasks} never trained on, {fam['scored']}, seed {a.seed}, "
          f"{a.steps} training steps on this CPU, precision {precision}")
    minutes = "minutes (side by side)" if together else "minutes"
    em = a.family == "search"  # F1 families also show exact match; accuracy is exact already
    print(f"| arm | before -> after |{' exact match after |' * em} best-by-validation (its step) | training calls | "
          f"calls per {tasks[:-1]} | {minutes} |")
    print("| --- | --- |" + " --- |" * (4 + em))
    for name, r in rows.items():
        mins = f"{took[name] / 60:.1f}" if took[name] else "(done before)"
        exact = f" {r['em']:.3f} |" if em else ""
        best = f"{r['best'][0]:.3f} ({r['best'][1]})" if r["best"] else "(not kept)"
        print(f"| {name} | {r['before']:.3f} -> **{r['after']:.3f}** |{exact} {best} | {r['train_calls']} | "
              f"{r['per_question']:.1f} | {mins} |")
    team = rows[team_name]["after"]
    best_agent = max(agent_names, key=lambda k: rows[k]["after"])
    agent = rows[best_agent]["after"]
    verdict = "ahead of" if team > agent else "level with" if team == agent else "behind"
    print(f"\nThe trained team is {verdict} the strongest trained single agent, {best_agent} ({team:.3f} vs "
          f"{agent:.3f}), after {a.steps} steps. Seeds differ by about 0.1 here: compare over seeds (`--seed 1`, "
          f"`--seed 2`); {fam['more']}.")


if __name__ == "__main__":
    main()
