"""A verifiers tool environment: a calculator toolset (served over MCP by verifiers) the agent may call."""

import verifiers.v1 as vf
from vf_calc_tools import CalcToolset


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return 1.0 if self.data.answer in (trace.last_reply or "") else 0.0


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 4
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self) -> list[CalcTask]:
        return [CalcTask(CalcData(prompt=f"Use the add tool: what is {i} + {2 * i}?", answer=str(3 * i)),
                         self.config.task) for i in range(1, self.config.num_tasks + 1)]


__all__ = ["CalcTaskset"]
