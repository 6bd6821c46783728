"""Runs a verifiers environment for masrl's ``verifiers`` workflow, in the Python that has verifiers installed.

A program of its own (it imports nothing of masrl): verifiers 0.4 pins ``openai<3`` and ``mcp==2.0.0``, so it
lives in its own environment (``make verifiers``), the way verl and vLLM run beside masrl in their own
processes. It speaks JSON lines:

- ``python verifiers_runner.py check CONFIG``: loads the environment and prints ``{"seats", "tasks"}``
  (or ``{"error"}`` and exits 2);
- ``python verifiers_runner.py list CONFIG``: prints the taskset's tasks, one ``{"idx", "prompt"}`` per line;
- ``python verifiers_runner.py serve CONFIG``: reads ``{"id", "idx", "base_url"}`` lines on stdin and runs
  each as one episode of the environment, every seat's model calls sent to ``base_url`` (masrl's gateway,
  which traces them), and answers ``{"id", "ok", "seats": {seat: reward}, "rewards", "errors", "tools"}`` per
  episode (``tools``: the tools its requests offered the model).

``CONFIG`` is JSON: ``{"env": <verifiers EnvConfig fields>, "models": {seat: model name}, "limit": n, "path": dir}``
(``path``: a folder to import the taskset's module from).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback

KEY_VAR = "MASRL_VERIFIERS_KEY"
# run as a file, this folder leads sys.path, and masrl's workflows/verifiers.py would shadow the library
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]


def _write(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _load(config: dict):
    from verifiers.v1.utils.loaders import default_harness_id, load_environment, resolve_env_config

    env_cfg = dict(config["env"])
    # a taskset that ships no harness gets verifiers' plain chat program (``null``: the prompt, the task's tools
    # over MCP), not its default ``bash`` agent, which would run model-written shell commands on this machine
    bundled = default_harness_id(env_cfg["taskset"].get("id", "")) != "bash"
    for seat, model in config.get("models", {}).items():
        seat_cfg = dict(env_cfg.get(seat) or {})
        seat_cfg.setdefault("model", model)
        if not bundled:
            seat_cfg.setdefault("harness", {"id": "null"})
        seat_cfg.setdefault("runtime", {"type": "subprocess"})  # on this machine: no sandbox service, no tunnel
        env_cfg[seat] = seat_cfg
    env = load_environment(resolve_env_config(env_cfg))
    return env


def _seats(env) -> list[str]:
    from verifiers.v1.configs.agent import agent_config_fields

    return list(agent_config_fields(env.config))


def _tasks(env, limit: int | None) -> list:
    view = env.taskset.take(limit) if limit else env.taskset
    if not view.bounded:
        raise ValueError("the taskset is infinite: give workflow.options.limit (how many of its tasks to list)")
    return list(view)


def _prompt_text(prompt) -> str:
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    parts = []
    for m in prompt:
        content = m.get("content") if isinstance(m, dict) else getattr(m, "content", "")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(getattr(p, "text", ""))
                               for p in content)
        parts.append(str(content or ""))
    return "\n".join(parts)


async def _episode(env, tasks: list, seats: list[str], job: dict) -> dict:
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig

    task = tasks[job["idx"]]
    ctx = ModelContext(model=job["model"], client=EvalClientConfig(base_url=job["base_url"], api_key_var=KEY_VAR))
    episode = await env.run_episode(task, ctx)
    rewards: dict[str, float] = {}
    parts: dict[str, float] = {}
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    for trace in episode.traces:
        seat = trace.agent.name if trace.agent is not None and trace.agent.name else seats[0]
        rewards[seat] = rewards.get(seat, 0.0) + float(trace.reward or 0.0)
        for name, r in (trace.rewards or {}).items():
            if r is not None and getattr(r, "score", None) is not None:  # a reward that raised has no score
                parts[f"{seat}.{name}"] = float(r.score)
        errors += [f"{e.type}: {e.message}" for e in (trace.errors or [])]
    tools = sorted({tool.name for trace in episode.traces for tool in (trace.tools or [])})
    return {"id": job["id"], "ok": bool(episode.ok), "seats": rewards, "rewards": parts, "errors": errors,
            "tools": tools}


async def _serve(env, tasks: list, seats: list[str]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: set[asyncio.Task] = set()

    async def one(job: dict) -> None:
        try:
            _write(await _episode(env, tasks, seats, job))
        except Exception as exc:  # this episode alone fails, with the environment's message
            _write({"id": job.get("id"), "ok": False, "seats": {}, "rewards": {},
                    "errors": [f"{type(exc).__name__}: {exc}"], "traceback": traceback.format_exc()[-2000:]})

    async with env.serving():
        _write({"ready": True})
        while line := await reader.readline():
            job = json.loads(line)
            t = asyncio.ensure_future(one(job))
            running.add(t)
            t.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running, return_exceptions=True)


def main(argv: list[str]) -> int:
    mode, config = argv[0], json.loads(argv[1])
    if config.get("path"):  # the folder of the user's taskset module
        sys.path.insert(0, os.path.abspath(config["path"]))
    os.environ.setdefault(KEY_VAR, "masrl")
    try:
        env = _load(config)
        seats = _seats(env)
        if mode == "check":
            _write({"seats": seats, "tasks": len(_tasks(env, config.get("limit")))})
            return 0
        tasks = _tasks(env, config.get("limit"))
        if mode == "list":
            for i, task in enumerate(tasks):
                # a task without a prompt (an OpenEnv reset, a game) is named by its name, else its data
                text = _prompt_text(task.data.prompt) or task.data.name or task.data.model_dump_json()[:2000]
                _write({"idx": i, "prompt": text})
            return 0
    except Exception as exc:  # the environment could not be built: said in one line
        _write({"error": f"{type(exc).__name__}: {exc}"})
        return 2
    asyncio.run(_serve(env, tasks, seats))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
