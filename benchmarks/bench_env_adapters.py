"""What an environment standard costs: a step of a native masrl family against the same family brought in through
OpenEnv, verifiers and PettingZoo (CPU, tiny-random, same seed).

Run: python benchmarks/bench_env_adapters.py [--steps 4] [--eval 16]

Rows (each a ``masrl train`` child process; step seconds are the median of its steps after the first):

- ``math/solver`` native, against ``workflow: openenv`` on masrl's own math/solver served in process as an OpenEnv
  ``TaskEnvironment`` (``messages_field: messages``: the same chat goes to the model). Both evaluate the same held-out
  tasks greedily, so their held-out rewards must be equal, task by task (``same rewards``).
- ``workflow: verifiers`` on the same served math/solver: verifiers' own ``openenv`` taskset steps an OpenEnv server
  (``masrl environment math/solver``), its ``player`` seat played by masrl's agent through the gateway. Its prompts
  are verifiers' (the observation and action schema as JSON), so its rewards are not comparable; the row measures
  what verifiers' machinery costs a step (a harness program per episode, its interception server, the runner).
- TicTacToe through PettingZoo (``workflow: pettingzoo``) against OpenSpiel's (``workflow: openspiel``), the same
  self-play setup; different libraries, different renderings: the time of a step only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _run(name: str, data: dict, out: Path, steps: int, env: dict | None = None) -> dict:
    data = dict(data, name=name, output_dir=str(out / name), model="tiny-random")
    data["train"] = {"steps": steps, "save_every": 1000, "eval_before": True, "eval_after": False, "log_traces": 0}
    data.setdefault("eval", {})["log_traces"] = 1000
    cfg = out / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(data))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, **(env or {})))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps_s = [r["rollout_s"] + r["update_s"] for r in rows if "rollout_s" in r]
    evals = [json.loads(x) for x in (out / name / "eval_traces.jsonl").read_text().splitlines()]
    by_prompt = {t["calls"][0]["messages"][-1]["content"]: (t["calls"][0]["completion"], t["metrics"].get("outcome"))
                 for t in evals if t["calls"]}
    return {"name": name, "step_s": statistics.median(steps_s[1:] or steps_s), "wall_s": wall,
            "failed": sum(r["rollout"]["failed"] for r in rows if "rollout" in r), "eval": by_prompt}


def _base(config: str, tasks: int, tokens: int = 32) -> dict:
    from masrl.families import config_path

    data = yaml.safe_load(config_path(config).read_text())
    data["rollout"] = {"tasks_per_step": tasks, "samples_per_task": 4}
    data["algorithm"] = {**data.get("algorithm", {}), "micro_batch_size": 8}
    for a in data["agents"].values():
        a["max_new_tokens"] = tokens
    for p in data["policies"].values():
        p.pop("model", None)
    return data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32, help="max new tokens a call")
    ap.add_argument("--eval", type=int, default=16, help="held-out tasks, greedy, compared task by task")
    ap.add_argument("--skip", nargs="*", default=[], help="rows to leave out: openenv verifiers pettingzoo")
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="bench-env-"))
    over = [f"data.eval.n={args.eval}", "model=tiny-random", f"agents.solver.max_new_tokens={args.tokens}"]
    rows = []
    native = _base("math/solver", 4, args.tokens)
    native["data"]["eval"]["n"] = args.eval
    native["rewards"] = [{"type": "outcome", "weight": 1.0}]  # the rewards every row pays
    rows.append(_run("native_math_solver", native, out, args.steps))

    if "openenv" not in args.skip:
        d = _base("math/solver", 4, args.tokens)
        d["workflow"] = {"name": "openenv", "options": {
            "env": "masrl.driver.serving.environment:TaskEnvironment", "messages_field": "messages",
            "agents": ["solver"], "max_new_tokens": args.tokens,
            "env_options": {"config": "math/solver", "split": "all", "overrides": over}}}
        # each task resets the environment on itself: the native run's tasks, ids and order (seeds: the index into
        # the served config's training tasks, then its held-out ones)
        d["data"] = {"train": {"source": "bench_env_adapters:seeds", "n": native["data"]["train"]["n"],
                               "options": {"config": "math/solver", "split": "train", "overrides": over}},
                     "eval": {"source": "bench_env_adapters:seeds", "n": args.eval,
                              "options": {"config": "math/solver", "split": "eval", "overrides": over}}}
        d["rewards"] = [{"type": "outcome", "weight": 1.0}]
        rows.append(_run("openenv_math_solver", d, out, args.steps,
                         {"PYTHONPATH": f"{ROOT / 'benchmarks'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}))

    if "verifiers" not in args.skip:
        port = _free_port()
        server = subprocess.Popen([sys.executable, "-m", "masrl.cli", "environment", "math/solver", *over, "--port",
                                   str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            for _ in range(600):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            env = {"taskset": {"id": "openenv", "base_url": f"http://127.0.0.1:{port}",
                               "resets": [{"seed": i} for i in range(args.eval + 200)]}}
            d = _base("math/solver", 4, args.tokens)
            d["workflow"] = {"name": "verifiers", "options": {"env": env, "seats": {"player": "solver"}}}
            d["data"] = {"train": {"source": "verifiers", "n": 200, "options": {"env": env, "idx": f"{args.eval}:"}},
                         "eval": {"source": "verifiers", "n": args.eval,
                                  "options": {"env": env, "idx": f"0:{args.eval}"}}}
            d["rewards"] = [{"type": "outcome", "weight": 1.0}]
            rows.append(_run("verifiers_openenv_math_solver", d, out, args.steps))
        finally:
            server.terminate()
            server.wait(timeout=30)

    if "pettingzoo" not in args.skip:
        for name, config in (("openspiel_tictactoe", "games/spiel_tic_tac_toe_selfplay"),
                             ("pettingzoo_tictactoe", "games/zoo_tictactoe_selfplay")):
            d = _base(config, 4, args.tokens)
            d["data"]["eval"]["n"] = 8
            rows.append(_run(name, d, out, args.steps))

    base = {r["name"]: r for r in rows}
    print(f"\n{' '.join(sys.argv)}  ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"tiny-random, {args.steps} steps of 4 tasks x 4 samples)")
    print(f"{'row':34s} {'step s':>8s} {'ratio':>7s} {'failed':>6s}  same rewards")
    pairs = {"openenv_math_solver": "native_math_solver", "verifiers_openenv_math_solver": "native_math_solver",
             "pettingzoo_tictactoe": "openspiel_tictactoe"}
    for r in rows:
        ref = base.get(pairs.get(r["name"], r["name"]))
        same = ""
        if r["name"] == "openenv_math_solver":
            shared = set(r["eval"]) & set(ref["eval"])
            equal = sum(r["eval"][p] == ref["eval"][p] for p in shared)
            right = sum(r["eval"][p][1] == 1.0 for p in shared)
            same = f"{equal}/{len(shared)} held-out tasks (of {len(ref['eval'])}), completion and reward; {right} right"
        print(f"{r['name']:34s} {r['step_s']:8.2f} {r['step_s'] / ref['step_s']:7.2f} {r['failed']:6d}  {same}")


def seeds(spec):
    """The config's own tasks (``options.config``; ``options.split``), each with the seed that resets a
    ``TaskEnvironment(split="all")`` on it (its index among the training tasks, then the held-out ones) and its own
    id, so that a run draws the same tasks in the same order and samples them with the same seeds as the native run."""
    from masrl.config import load_config
    from masrl.data.tasks import Task
    from masrl.families import build_tasks, config_path

    cfg = load_config(config_path(spec.options["config"]), spec.options.get("overrides", []))
    train, held_out = build_tasks(cfg)
    if spec.options.get("split") == "eval":
        return [Task(t.id, t.question, t.answer, {"seed": len(train) + i}) for i, t in enumerate(held_out)]
    return [Task(t.id, t.question, t.answer, {"seed": i}) for i, t in enumerate(train)]


if __name__ == "__main__":
    main()
