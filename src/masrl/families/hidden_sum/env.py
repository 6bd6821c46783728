"""HiddenSum: a seeded cooperative hidden-information puzzle for two agents.

The scout sees a secret number ``x``; the solver sees ``y`` and the question "what is x + y?".
Neither can answer alone: the scout must send ``x`` to the solver in a message, and the solver
must add. Turn order: scout, solver, and (``rounds`` > 1) again, the solver answering on its
last turn at the latest.

scout    <message>text for the solver</message>
solver   <answer>number</answer>   or   <message>question for the scout</message>

Rewards, cooperative: both agents get 1 when the solver's answer is x + y (on the step it
answers); the scout also gets ``relay_bonus`` on a step whose message contains x (shaping a
135M model needs: otherwise a wrong sum hides a good relay). Metrics: ``outcome`` (solved),
``relayed`` (x reached the solver), and per agent ``scout/accuracy`` (relayed) and
``solver/accuracy`` (correct, given a relay).
"""

from __future__ import annotations

import random
import re

from masrl.agents import AgentRole
from masrl.envs.base import StepResult
from masrl.parsing import ParseResult, TagSpec, is_number, nonempty, parse_tags

SCOUT_SYSTEM = ("You are the scout in a team of two. You see a secret number; your teammate must use it. "
                "Send it in <message></message>.")
SCOUT_EXAMPLES = [("Secret number: 14", "<message>The secret number is 14.</message>"),
                  ("Secret number: 31", "<message>The secret number is 31.</message>")]
SOLVER_SYSTEM = ("You are the solver in a team of two. Your teammate knows x and sends it to you. Add x and your "
                 "number y, and write only the sum in <answer></answer>.")
SOLVER_EXAMPLES = [("Your number y: 5\nMessage from the scout: The secret number is 14.\nWhat is x + y?",
                    "<answer>19</answer>"),
                   ("Your number y: 12\nMessage from the scout: The secret number is 31.\nWhat is x + y?",
                    "<answer>43</answer>")]


def _few_shot(system, examples, user):
    msgs = [{"role": "system", "content": system}]
    for q, a in examples:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs + [{"role": "user", "content": user}]


def parse_scout(text: str) -> ParseResult:
    return parse_tags(text, [TagSpec("message", nonempty)])


def parse_solver(text: str) -> ParseResult:
    if "<message>" in text and "<answer>" not in text:
        return parse_tags(text, [TagSpec("message", nonempty)])
    return parse_tags(text, [TagSpec("answer", is_number)])


class HiddenSum:
    agents = ["scout", "solver"]

    def __init__(self, rounds: int = 1, max_value: int = 20, relay_bonus: float = 0.5):
        if rounds < 1 or max_value < 2:
            raise ValueError("hidden_sum needs rounds >= 1 and max_value >= 2")
        self.rounds, self.max_value, self.relay_bonus = rounds, max_value, relay_bonus

    def roles(self) -> dict[str, AgentRole]:
        return {"scout": AgentRole("scout", parse_scout, "knows x; must send it", 32, ("</message>",)),
                "solver": AgentRole("solver", parse_solver, "knows y; answers x + y", 24, ("</answer>", "</message>"))}

    def reset(self, seed: int) -> dict[str, str]:
        rng = random.Random(seed)
        self.x, self.y = rng.randint(1, self.max_value), rng.randint(1, self.max_value)
        self.turn, self.inbox = 0, {"scout": [], "solver": []}
        self.answer, self.relayed, self.done = None, False, False
        return {"scout": f"Secret number: {self.x}", "solver": f"Your number y: {self.y}"}

    def next_agent(self) -> str | None:
        if self.done or self.turn >= 2 * self.rounds:
            return None
        return self.agents[self.turn % 2]

    def prompt(self, agent: str) -> list[dict]:
        if agent == "scout":
            body = f"Secret number: {self.x}" + "".join(f"\nQuestion from the solver: {m}" for m in self.inbox["scout"])
            return _few_shot(SCOUT_SYSTEM, SCOUT_EXAMPLES, body)
        msgs = "".join(f"\nMessage from the scout: {m}" for m in self.inbox["solver"]) or "\n(no message yet)"
        return _few_shot(SOLVER_SYSTEM, SOLVER_EXAMPLES, f"Your number y: {self.y}{msgs}\nWhat is x + y?")

    def step(self, agent: str, action: str, parsed: dict) -> StepResult:
        self.turn += 1
        res = StepResult()
        if agent == "scout":
            msg = parsed.get("message") or action.strip()
            res.messages["solver"] = [msg]
            self.inbox["solver"].append(msg)
            if re.search(rf"(?<!\d){self.x}(?!\d)", msg):
                self.relayed = True
                res.rewards["scout"] = self.relay_bonus
            return res
        last = self.turn >= 2 * self.rounds
        if parsed.get("answer") is not None or last:
            self.answer = parsed.get("answer")
            won = float(self._correct())
            res.rewards = {"scout": won, "solver": won}
            res.done = self.done = True
        else:
            q = parsed.get("message") or action.strip()
            res.messages["scout"] = [q]
            self.inbox["scout"].append(q)
        return res

    def _correct(self) -> bool:
        try:
            return self.answer is not None and float(str(self.answer).replace(",", "")) == self.x + self.y
        except ValueError:
            return False

    def outcome(self) -> dict[str, float]:
        won = float(self._correct())
        out = {"outcome": won, "relayed": float(self.relayed), "scout/accuracy": float(self.relayed)}
        if self.relayed:
            out["solver/accuracy"] = won
        return out
