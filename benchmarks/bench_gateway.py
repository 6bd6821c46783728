"""The gateway's cost: a two-agent team driven through the OpenAI-compatible gateway against the
same team as an in-process workflow, same engine, same run.

Both sides run the same episode: a solver call, then a checker call on the solver's text, each
exactly ``--tokens`` new tokens (EOS ignored), ``--episodes`` episodes at once. The gateway side is
an outside program written with the official ``openai`` client (``AsyncOpenAI``, in the driver's
event loop, over HTTP on 127.0.0.1); the in-process side calls ``ctx.call`` directly. Rollouts only
(no update). Prints calls/s and tokens/s for both, their ratio, and the per-call overhead measured
one episode at a time.

    python benchmarks/bench_gateway.py [--model tiny-random] [--episodes 64] [--tokens 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SOLVER = "Solve the problem. End with the answer."
CHECKER = "State the final number."


class TwoCalls:
    """The in-process side: the same two calls as ``outside_team``, through ``ctx.call``."""

    name = "two_calls"

    def roles(self):
        from masrl.agents import AgentRole
        from masrl.workflows.external import parse_raw

        return {a: AgentRole(a, parse_raw, a, 64, ()) for a in ("solver", "checker")}

    async def run(self, task, ctx):
        a = await ctx.call("solver", [{"role": "system", "content": SOLVER}, {"role": "user", "content": task.question}])
        b = await ctx.call("checker", [{"role": "system", "content": CHECKER},
                                       {"role": "user", "content": f"{task.question}\n{a.completion}"}])
        ctx.finish(b.completion)

    def score(self, trace, task):
        return {"outcome": 0.0}


_CLIENT = None


async def outside_team(task: dict, base_url: str) -> str:
    """The gateway side: an outside program with the official async client, made once and pointed at
    each episode's base URL with ``with_options`` (which keeps its connection pool: making a client
    per episode costs 17 ms here, mostly loading the system's CA certificates, before any request)."""
    from openai import AsyncOpenAI

    global _CLIENT
    if _CLIENT is None:
        _CLIENT = AsyncOpenAI(base_url=base_url, api_key="masrl", max_retries=0)
    client = _CLIENT.with_options(base_url=base_url)
    a = await client.chat.completions.create(model="solver", messages=[
        {"role": "system", "content": SOLVER}, {"role": "user", "content": task["question"]}])
    b = await client.chat.completions.create(model="checker", messages=[
        {"role": "system", "content": CHECKER},
        {"role": "user", "content": f"{task['question']}\n{a.choices[0].message.content}"}])
    return b.choices[0].message.content


_SESSION = None


async def outside_team_raw(task: dict, base_url: str) -> str:
    """The same program with a bare HTTP client (aiohttp, one session): what the gateway costs
    without the openai SDK's own work per request."""
    import aiohttp

    global _SESSION
    if _SESSION is None:
        _SESSION = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def ask(model, messages):
        async with _SESSION.post(f"{base_url}/chat/completions", json={"model": model, "messages": messages}) as r:
            return (await r.json())["choices"][0]["message"]["content"]

    a = await ask("solver", [{"role": "system", "content": SOLVER}, {"role": "user", "content": task["question"]}])
    return await ask("checker", [{"role": "system", "content": CHECKER},
                                 {"role": "user", "content": f"{task['question']}\n{a}"}])


async def close_clients() -> None:
    global _CLIENT, _SESSION
    if _CLIENT is not None:
        await _CLIENT.close()
    if _SESSION is not None:
        await _SESSION.close()
    _CLIENT = _SESSION = None


def config(model: str, workflow: dict, tokens: int) -> dict:
    agent = {"policy": "shared", "temperature": 1.0, "max_new_tokens": tokens, "ignore_eos": True}
    return {"name": "bench_gateway", "model": model, "policies": {"shared": {}},
            "agents": {"solver": dict(agent), "checker": dict(agent)}, "workflow": workflow,
            "data": {"train": {"source": "arithmetic", "n": 512, "seed": 1}, "eval": {"source": "arithmetic", "n": 4, "seed": 2}},
            "rollout": {"max_in_flight": 256, "max_batch_size": 256},  # the default 20 ms batching wait
            "rewards": [{"type": "outcome"}], "train": {"steps": 0, "eval_before": False, "eval_after": False}}


def measure(model: str, workflow: dict, episodes: int, tokens: int, rounds: int, run_dir: Path) -> dict:
    from masrl.config import load_config
    from masrl.driver.run.loop import Trainer

    tr = Trainer(load_config(data=config(model, workflow, tokens)), run_dir=run_dir)
    tr.prepare(resume=False)
    ctl = tr.rt.controller

    async def go():
        await ctl.rollout(tr.train_tasks[:episodes], 1, train=False)  # warm-up: batches, threads, connections
        best = None
        for r in range(rounds):
            tasks = tr.train_tasks[episodes * (r + 1): episodes * (r + 2)]
            t0 = time.perf_counter()
            traces = await ctl.rollout(tasks, 1, train=False)
            dt = time.perf_counter() - t0
            assert not any(t.failed for t in traces), [t.error for t in traces if t.failed][:2]
            calls = sum(len(t.calls) for t in traces)
            toks = sum(c.n_completion_tokens for t in traces for c in t.calls)
            best = max(best or (0, 0, 0), (calls / dt, toks / dt, dt))
        stats = ctl.batchers[0].stats
        mean_batch = stats.mean_batch
        t0 = time.perf_counter()  # one episode at a time: the latency of a call
        for task in tr.train_tasks[-8:]:
            await ctl.rollout([task], 1, train=False)
        per_call_ms = (time.perf_counter() - t0) / 16 * 1000
        await ctl.aclose()
        import importlib

        await importlib.import_module("bench_gateway").close_clients()  # the module the config loaded, not __main__
        return {"calls_s": best[0], "tokens_s": best[1], "per_call_ms": per_call_ms, "mean_batch": mean_batch}

    try:
        return asyncio.run(go())
    finally:
        tr.rt.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default=None, help="cpu | cuda (default: the config's auto)")
    a = ap.parse_args()
    import tempfile

    import torch

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"in-process workflow": {"name": "bench_gateway:TwoCalls"},
                 "gateway (openai client)": {"name": "external", "options": {
                     "agents": ["solver", "checker"], "agent": "bench_gateway:outside_team", "score": "exact"}},
                 "gateway (bare HTTP client)": {"name": "external", "options": {
                     "agents": ["solver", "checker"], "agent": "bench_gateway:outside_team_raw", "score": "exact"}}}
        for name, wf in sides.items():
            out[name] = measure(a.model, wf, a.episodes, a.tokens, a.rounds, Path(tmp) / name.split()[0])
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}"
    print(f"command: python benchmarks/bench_gateway.py {' '.join(sys.argv[1:])}\nmachine: {machine}")
    print(f"model {a.model}, {a.episodes} episodes at once, 2 calls each, {a.tokens} new tokens per call, "
          f"best of {a.rounds} rounds\n")
    print("| side | calls/s | tokens/s | mean engine batch | ms per call, one episode at a time |\n"
          "| --- | --- | --- | --- | --- |")
    for name, r in out.items():
        print(f"| {name} | {r['calls_s']:.1f} | {r['tokens_s']:.0f} | {r['mean_batch']:.1f} | {r['per_call_ms']:.1f} |")
    ins = out["in-process workflow"]
    for name in ("gateway (openai client)", "gateway (bare HTTP client)"):
        gw = out[name]
        print(f"\n{name} / in-process: calls/s {gw['calls_s'] / ins['calls_s']:.2f}x (bar >= 0.8), "
              f"per-call overhead {gw['per_call_ms'] - ins['per_call_ms']:.1f} ms")


if __name__ == "__main__":
    main()
