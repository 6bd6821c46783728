"""A verifiers taskset whose reward raises on one task: that episode alone fails, with the environment's message."""

import verifiers.v1 as vf


class FlakyData(vf.TaskData):
    broken: bool = False


class FlakyTask(vf.Task[FlakyData]):
    @vf.reward(weight=1.0)
    async def scored(self, trace: vf.Trace) -> float:
        if self.data.broken:
            raise ValueError("the grader of this task is broken")
        return 1.0


class FlakyTaskset(vf.Taskset[FlakyTask, vf.TasksetConfig]):
    def load(self) -> list[FlakyTask]:
        return [FlakyTask(FlakyData(prompt=f"Say {i}.", broken=i == 1), self.config.task) for i in range(4)]


__all__ = ["FlakyTaskset"]
