"""A verifiers taskset written as verifiers' own scaffold writes one: 'what is i + 1?', scored by its @reward."""

import verifiers.v1 as vf


class CountData(vf.TaskData):
    answer: str = ""


class CountTask(vf.Task[CountData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in (trace.last_reply or "") else 0.0


class CountConfig(vf.TasksetConfig):
    num_tasks: int = 6


class CountTaskset(vf.Taskset[CountTask, CountConfig]):
    def load(self) -> list[CountTask]:
        return [CountTask(CountData(prompt=f"What is {i} + 1? Answer with the number.", answer=str(i + 1)),
                          self.config.task) for i in range(self.config.num_tasks)]


__all__ = ["CountTaskset"]
