"""A verifiers environment written to verifiers 0.4's own interface, as its scaffold (``vf init``) writes one:
two-number arithmetic, scored by the task's ``@reward``. masrl trains on it unchanged (examples/verifiers_arith.yaml);
verifiers' own ``vf-eval`` would run it the same way against any OpenAI-compatible endpoint."""

import random
import re

import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int = 0


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = re.findall(r"-?\d+", trace.last_reply or "")
        return 1.0 if numbers and int(numbers[-1]) == self.data.answer else 0.0


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    seed: int = 0


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(2, 49), rng.randint(2, 49)
            op = rng.choice("+-")
            prompt = f"What is {a} {op} {b}? End your reply with the number."
            tasks.append(ArithTask(ArithData(prompt=prompt, answer=a + b if op == "+" else a - b), self.config.task))
        return tasks


__all__ = ["ArithTaskset"]
