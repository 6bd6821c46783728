"""Run a multi-agent environment (``masrl.envs.Environment``) as a workflow on masrl's traces.

    workflow: {name: env, options: {env: hidden_sum, rounds: 1}}     # or env: my.module:MyEnv
    data.train: {source: episodes, n: 2000, seed: 1}                  # one seeded episode per task

Each task carries an episode seed; ``reset(seed)`` starts the episode, then the adapter asks
``next_agent()`` for the turn order, calls that agent on ``prompt(agent)``, and passes the text
and its parsed fields to ``step``. Per-step rewards become call credit (the acting agent's on
its call; another agent's on its latest call), so train with the ``credit`` reward.
"""

from __future__ import annotations

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.trace import Trace


class EnvWorkflow:
    name = "env"

    def __init__(self, env: "str | type", max_steps: int = 64, **options):
        if isinstance(env, str):  # a family's environment by name reaches here as its class (masrl.families)
            from masrl.config.loading import load_object

            self.factory = load_object(env, "workflow.options.env")
        else:
            self.factory = env
        self.options, self.max_steps = options, max_steps
        self.env_name = env if isinstance(env, str) else getattr(env, "name", env.__name__)
        self._roles = self.factory(**options).roles()

    def roles(self) -> dict[str, AgentRole]:
        return dict(self._roles)

    async def run(self, task: Task, ctx) -> None:
        env = self.factory(**self.options)
        seed = int(task.meta.get("seed", 0))
        env.reset(seed)
        latest: dict = {}
        steps = 0
        while (agent := env.next_agent()) is not None:
            if steps >= self.max_steps:
                raise RuntimeError(f"environment '{self.env_name}' did not end within {self.max_steps} steps "
                                   f"(workflow.options.max_steps)")
            steps += 1
            if agent not in self._roles:
                raise KeyError(f"environment '{self.env_name}' gave the turn to '{agent}', which its roles() lack")
            call = await ctx.call(agent, env.prompt(agent))
            res = env.step(agent, call.completion or "", dict(call.parsed))
            call.credit = 0.0
            latest[agent] = call
            for who, r in res.rewards.items():
                target = latest.get(who)
                if target is not None:
                    target.credit = (target.credit or 0.0) + float(r)
            if res.done:
                break
        ctx.finish(getattr(env, "answer", None), env_metrics=env.outcome(), env_steps=steps)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        out = dict(trace.state.get("env_metrics") or {})
        if "outcome" not in out:
            raise KeyError(f"environment '{self.env_name}': outcome() must return an 'outcome' metric")
        out["steps"] = float(trace.state.get("env_steps", 0))
        return out
