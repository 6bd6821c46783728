"""A two-agent verifiers environment (v1 ``Env.run(task, agents)``): a proposer answers, then a checker sees the
proposer's answer and gives its own; each seat is scored by the task's @reward on its own trace."""

import verifiers.v1 as vf


class DuelData(vf.TaskData):
    answer: str = ""


class DuelTask(vf.Task[DuelData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in (trace.last_reply or "") else 0.0


class DuelTasksetConfig(vf.TasksetConfig):
    num_tasks: int = 4


class DuelTaskset(vf.Taskset[DuelTask, DuelTasksetConfig]):
    def load(self) -> list[DuelTask]:
        return [DuelTask(DuelData(prompt=f"What is {i} * 2?", answer=str(2 * i)), self.config.task)
                for i in range(1, self.config.num_tasks + 1)]


class DuelConfig(vf.EnvConfig):
    proposer: vf.AgentConfig = vf.AgentConfig()
    checker: vf.AgentConfig = vf.AgentConfig()


class DuelEnv(vf.Env[DuelConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        first = await agents.proposer.run(task)
        seen = task.data.model_copy(update={"prompt": f"{task.data.prompt}\nA proposer said: {first.last_reply}\n"
                                                      f"Give the right answer."})
        await agents.checker.run(type(task)(seen, task.config))


__all__ = ["DuelTaskset", "DuelEnv"]
