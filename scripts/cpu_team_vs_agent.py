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

KEY=VALUE overrides go to both arms. ``--precision auto`` (the default) trains in bf16 (fp32 master weights)
where the CPU has bf16 units, about 1.6x faster a step, else in fp32.

Memory: an arm (SmolLM2-135M, bf16 weights, fp32 masters and AdamW moments, activation checkpointing) peaks
at about ``ARM_GB`` of RSS. ``--side-by-side auto`` (the default) trains as many arms at once as both the
cores (one each at least) and ``--memory-gb`` (default: the smaller of 8 GB and what the system has free)
allow, each in its own process on its share of the cores (``threads=``), its lines prefixed with the arm's
name and kept in the run's ``train.log``; the rest wait for a place. Each arm's minutes are its own
wall-clock. An arm the kernel kills for lack of memory is named so, with its peak RSS and what to do.

Interrupted or killed, the demo continues where it stopped when run again with the same ``--out``: a
finished arm is not run again, and an unfinished one resumes from its last checkpoint (every 4 steps).
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

from masrl.driver.run.rundir import read_jsonl
from masrl.worker.model.precision import cpu_bf16_units

ROOT = Path(__file__).resolve().parents[1]
# train.keep_best for every arm: validation tasks held back from training, and how often they score the weights;
# the held-out set is scored at the weights they pick beside the last step's
KEEP_N, KEEP_EVERY = 32, 2
ARM_GB = 5.0  # an arm's peak RSS as measured (3.9-5.1 GB, docs/benchmarks.md), with room: what side by side plans with
MEMORY_GB = 8.0  # at most this much for all arms together, unless --memory-gb says otherwise

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
    """A new arm trains its config; an arm that ran before (its folder holds the run's config) resumes
    as it was trained, from its last checkpoint."""
    if (out / "config.yaml").is_file():
        return [sys.executable, "-m", "masrl.cli", "resume", str(out)]
    return [sys.executable, "-m", "masrl.cli", "train", config, *overrides, f"output_dir={out}"]


def available_gb() -> float:
    """Memory the system can give without swapping (MemAvailable), in GB; 0 where it does not say."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def places(arms: int, cores: int, memory_gb: float, mode: str) -> int:
    """How many arms train at once: all with ``on``, one with ``off``; ``auto``: as many as there are cores
    and as ``memory_gb`` holds at ``ARM_GB`` each."""
    if mode == "on":
        return arms
    if mode == "off":
        return 1
    return max(1, min(arms, cores, int(memory_gb // ARM_GB)))


def killed_message(name: str, rc: int, peak_gb: float, log: Path) -> str:
    """What an arm's end says: the kernel's out-of-memory kill named as such, with what to do."""
    if rc in (-9, 137):
        return (f"{name} was killed (SIGKILL), most likely by the kernel for lack of memory: it had reached "
                f"{peak_gb:.1f} GB RSS, and {available_gb():.1f} GB are available now. Run the arms one at a time "
                f"(--side-by-side off) or close other programs, then run the demo again: it continues where it "
                f"stopped (its log: {log})")
    return f"{name} exited with {rc} (its log: {log})"


def run_arms(arms: dict[str, tuple[str, list[str], Path]], at_once: int) -> dict[str, tuple[float, float]]:
    """Train the arms, ``at_once`` at a time, each in its own process; every line an arm prints is shown
    prefixed with its name and kept in its output folder's ``train.log``. Returns each arm's seconds (to its
    own end, from its own start) and peak RSS in GB; an arm that fails stops the demo with its name, exit
    code and log, after the arms already running end."""
    gate = threading.Semaphore(at_once)
    done: dict[str, tuple[int, float, float]] = {}

    def train(name: str, config: str, overrides: list[str], out: Path) -> None:
        with gate:
            if any(rc for rc, _, _ in done.values()):
                return  # an arm failed: the demo stops; the others are not started
            cmd = arm_command(config, overrides, out)
            print(f"[{name}] $", " ".join(cmd[2:]), flush=True)
            out.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1)
            with (out / "train.log").open("a") as f:
                for line in proc.stdout:
                    f.write(line)
                    f.flush()
                    print(f"[{name}] {line}", end="", flush=True)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            done[name] = (proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 2**20)

    threads = [threading.Thread(target=train, args=(name, *arm), daemon=True) for name, arm in arms.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [killed_message(name, rc, peak, arms[name][2] / "train.log") for name, (rc, _, peak) in done.items() if rc]
    if failed:
        raise SystemExit("[demo] " + "; ".join(failed))
    return {name: (took, peak) for name, (_, took, peak) in done.items()}


def folder(kind: str, seed: int) -> str:
    """An arm's output folder: ``team-seed0`` for the team, ``agent-seed0`` (or ``stepwise-seed0``) for the
    single agent."""
    return f"{kind}-seed{seed}"


def summary(out: Path) -> dict:
    before, after = (json.loads((out / f"eval_{k}.json").read_text()) for k in ("before", "after"))
    best_file = out / "eval_best.json"  # train.keep_best: the held-out figures at the best-by-validation weights
    best = json.loads(best_file.read_text()) if best_file.is_file() else None
    steps = [r for r in read_jsonl(out / "metrics.jsonl") if "rollout" in r]
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
                    help="train arms at once, each on its share of the cores (auto: as many as the cores and "
                         "--memory-gb allow; off: one after the other on all cores)")
    ap.add_argument("--memory-gb", type=float, default=None,
                    help=f"memory all arms together may take (default: the smaller of {MEMORY_GB:g} GB and what the "
                         f"system has available); auto side by side plans {ARM_GB:g} GB an arm")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE config overrides for both arms")
    a = ap.parse_args()
    fam = FAMILIES[a.family]
    a.steps = a.steps or fam["steps"]
    precision = a.precision if a.precision != "auto" else ("bf16" if cpu_bf16_units() else "fp32")
    print(f"[demo] precision={precision} (bf16 weights with fp32 master weights where the CPU computes bf16 natively; "
          f"--precision fp32 for the fp32 figures)", flush=True)
    cores = os.cpu_count() or 1
    memory_gb = a.memory_gb if a.memory_gb is not None else min(MEMORY_GB, available_gb() or MEMORY_GB)
    arms = {name: (config, ROOT / a.out / folder(kind, a.seed)) for name, (kind, config, own) in fam["arms"].items()}
    todo = [name for name, (_, out) in arms.items() if not (out / "eval_after.json").is_file()]  # not run again
    at_once = places(len(todo), cores, memory_gb, a.side_by_side) if todo else 1
    threads = max(1, cores // at_once)
    # a checkpoint every 4 steps (the last kept): a demo stopped midway continues from there
    common = [f"seed={a.seed}", f"train.steps={a.steps}", "train.save_every=4", "train.keep_last=1", "data.eval.n=32",
              f"precision={precision}", f"train.keep_best.n={KEEP_N}", f"train.keep_best.every={KEEP_EVERY}",
              "algorithm.activation_checkpointing=true", f"threads={threads}", *a.overrides]
    if todo:
        print(f"[demo] {len(todo)} arm(s) to train, {at_once} at a time, {threads} thread(s) each on {cores} cores, "
              f"within {memory_gb:.1f} GB ({ARM_GB:g} GB an arm; --side-by-side on|off, --memory-gb)", flush=True)
    ran = run_arms({name: (arms[name][0], [*common, *fam["arms"][name][2]], arms[name][1]) for name in todo}, at_once)
    rows = {name: summary(out) for name, (_, out) in arms.items()}
    team_name, *agent_names = fam["arms"]
    n, tasks = rows[team_name]["questions"], fam["tasks"]
    print(f"\nheld-out: {n} {tasks} never trained on, {fam['scored']}, seed {a.seed}, "
          f"{a.steps} training steps on this CPU, precision {precision}")
    minutes = f"minutes ({at_once} at a time)" if at_once > 1 else "minutes"
    em = a.family == "search"  # F1 families also show exact match; accuracy is exact already
    print(f"| arm | before -> after |{' exact match after |' * em} best-by-validation (its step) | training calls | "
          f"calls per {tasks[:-1]} | {minutes} | peak RSS GB |")
    print("| --- | --- |" + " --- |" * (5 + em))
    for name, r in rows.items():
        took, peak = ran.get(name, (0.0, 0.0))
        mins = f"{took / 60:.1f}" if took else "(done before)"
        rss = f"{peak:.1f}" if peak else "-"
        exact = f" {r['em']:.3f} |" if em else ""
        best = f"{r['best'][0]:.3f} ({r['best'][1]})" if r["best"] else "(not kept)"
        print(f"| {name} | {r['before']:.3f} -> **{r['after']:.3f}** |{exact} {best} | {r['train_calls']} | "
              f"{r['per_question']:.1f} | {mins} | {rss} |")
    team = rows[team_name]["after"]
    best_agent = max(agent_names, key=lambda k: rows[k]["after"])
    agent = rows[best_agent]["after"]
    verdict = "ahead of" if team > agent else "level with" if team == agent else "behind"
    print(f"\nThe trained team is {verdict} the strongest trained single agent, {best_agent} ({team:.3f} vs "
          f"{agent:.3f}), after {a.steps} steps. Seeds differ by about 0.1 here: compare over seeds (`--seed 1`, "
          f"`--seed 2`); {fam['more']}.")


if __name__ == "__main__":
    main()
