"""JudgeReward: a score from a model behind an OpenAI-compatible endpoint (``type: judge``).

The judge sees the task's question, the trace's final answer (the last call's completion) and,
unless ``show_reference`` is off, the reference answer, and must reply with a number from 0 to
``scale``; ``weight * number / scale`` goes to every trainable call of the trace (or of ``agents``).
A judge that cannot be reached, or that replies without a number, is an infrastructure failure:
``InfraError`` drops the trace from training like an engine crash, and no reward is invented.
"""

from __future__ import annotations

import re

from masrl.data.tasks import Task
from masrl.trace import RewardAssignment, Trace

PROMPT = ("Question: {question}\nReference answer: {reference}\nProposed answer: {answer}\n\n"
          "How correct is the proposed answer? Reply with one number from 0 (wrong) to {scale} (fully correct), "
          "and nothing else.")
PROMPT_NO_REF = ("Question: {question}\nProposed answer: {answer}\n\nHow good is the proposed answer? Reply with one "
                 "number from 0 (useless) to {scale} (excellent), and nothing else.")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class JudgeReward:
    name = "judge"

    def __init__(self, weight: float = 1.0, *, base_url: str, model: str, api_key_env: str | None = None,
                 prompt: str | None = None, show_reference: bool = True, scale: float = 10.0,
                 agents: list[str] | None = None, max_tokens: int = 8, timeout_s: float = 60.0, retries: int = 3,
                 backoff_s: float = 0.5):
        from masrl.web.client import auth_headers

        self.weight, self.model, self.scale = weight, model, scale
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.headers = auth_headers(api_key_env, "rewards.judge.options")
        self.prompt = prompt or (PROMPT if show_reference else PROMPT_NO_REF)
        self.agents = set(agents) if agents else None
        self.http = dict(timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
        self.max_tokens = max_tokens
        self.stats: dict = {}

    def score(self, question: str, answer: str, reference) -> float:
        from masrl.errors import InfraError
        from masrl.web.client import post_chat

        text = self.prompt.format(question=question, answer=answer, reference=reference, scale=f"{self.scale:g}")
        out = post_chat(self.url, self.headers, {"model": self.model, "messages": [{"role": "user", "content": text}],
                                                 "temperature": 0.0, "max_tokens": self.max_tokens},
                        stats=self.stats, **self.http)
        try:
            reply = out["choices"][0]["message"].get("content") or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise InfraError(f"judge at {self.url}: unreadable response ({exc})") from None
        m = NUMBER.search(reply)
        if m is None:
            raise InfraError(f"judge at {self.url} replied without a score: {reply[:100]!r}")
        return min(max(float(m.group()), 0.0), self.scale) / self.scale

    def allocate(self, trace: Trace, task: Task) -> list[RewardAssignment]:
        if not trace.calls:
            return []
        s = self.score(task.question, trace.calls[-1].completion or "", task.answer)
        trace.metrics["judge"] = s
        return [RewardAssignment(c.call_id, self.weight * s, self.name) for c in trace.calls
                if c.trainable and (self.agents is None or c.agent in self.agents)]
