"""Debate: N agents answer, then for R rounds each sees the others' answers and revises; the
final answer is the majority vote of the last round (ties: the earliest agent's answer).

debater_i   <solution>work</solution><answer>number</answer>     (every round)

What each debater has that a single solver lacks: the other agents' answers and their work.
Credit per call (paid by the ``credit`` reward): whether that call's own answer is correct,
plus ``improve_weight`` x (correct now - correct in its previous round) for revisions, plus
``vote_bonus`` on every call of the trace when the vote is correct. Metrics: ``outcome`` (the
vote), ``round0_accuracy`` and ``final_accuracy`` (mean over agents), ``agreement`` (share of
last-round answers equal to the vote), and per agent ``debater_i/accuracy`` (its last round).
"""

from __future__ import annotations

from collections import Counter

from masrl.agents import AgentRole
from masrl.data.answers import answer_score, answers_equivalent, to_number
from masrl.data.tasks import Task
from masrl.families.math import roles as P
from masrl.families.math.roles import parse_solver
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot

REVISE_SYSTEM = (
    "You solve math word problems. Other students' answers are shown; check them, then write your own "
    "calculation in <solution></solution> and the final number in <answer></answer>."
)
REVISE_EXAMPLES = [
    ("Question: Ana has 3 pens and buys 4 more. How many pens does Ana have now?\n"
     "Other answers: 3 + 4 = 8 (answer 8); 3 + 4 = 7 (answer 7)",
     "<solution>3 + 4 = 7</solution><answer>7</answer>"),
    ("Question: Omar had 15 cards and gave away 6. How many cards are left?\n"
     "Other answers: 15 - 6 = 9 (answer 9); 15 + 6 = 21 (answer 21)",
     "<solution>15 - 6 = 9</solution><answer>9</answer>"),
]



def vote(answers: list) -> object:
    """The most common answer (compared as numbers where they parse); ties go to the earliest."""
    keys = [to_number(a) if to_number(a) is not None else a for a in answers]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a, k in zip(answers, keys) if k is not None and counts[k] == best)


class Debate:
    name = "debate"

    def __init__(self, agents: int = 3, rounds: int = 1, improve_weight: float = 0.0, vote_bonus: float = 0.5):
        if agents < 2 or rounds < 0:
            raise ValueError("debate needs agents >= 2 and rounds >= 0")
        self.n, self.rounds = agents, rounds
        self.improve_weight, self.vote_bonus = improve_weight, vote_bonus

    def roles(self) -> dict[str, AgentRole]:
        return {f"debater_{i}": AgentRole(f"debater_{i}", parse_solver, "answers, then revises after reading the "
                                          "others", 64, ("</answer>",)) for i in range(self.n)}

    async def run(self, task: Task, ctx) -> None:
        import asyncio

        q = task.question
        names = list(self.roles())
        first = [ctx.call(a, few_shot(P.SOLVER_SYSTEM, P.SOLVER_EXAMPLES, q), turn=0) for a in names]
        calls = list(await asyncio.gather(*first))
        history = [calls]
        for r in range(1, self.rounds + 1):
            prev = history[-1]
            shown = [f"{c.parsed.get('solution') or '?'} (answer {c.parsed.get('answer') or '?'})" for c in prev]
            revisions = [ctx.call(a, few_shot(REVISE_SYSTEM, REVISE_EXAMPLES, f"Question: {q}\nOther answers: "
                                                + "; ".join(s for j, s in enumerate(shown) if j != i)), turn=r)
                         for i, a in enumerate(names)]
            history.append(list(await asyncio.gather(*revisions)))
        correct = [[answer_score(c.parsed.get("answer"), task.answer) for c in rnd] for rnd in history]
        final = vote([c.parsed.get("answer") for c in history[-1]])
        won = answer_score(final, task.answer)
        for r, rnd in enumerate(history):
            for i, c in enumerate(rnd):
                c.turn_score = correct[r][i]
                shaping = self.improve_weight * (correct[r][i] - correct[r - 1][i]) if r else 0.0
                c.credit = correct[r][i] + shaping + self.vote_bonus * won
        ctx.finish(final, correct=correct)

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        correct = trace.state.get("correct") or [[0.0] * self.n]
        last = correct[-1]
        answers = [c.parsed.get("answer") for c in trace.calls if c.turn == len(correct) - 1]
        agree = [a is not None and trace.final_answer is not None and answers_equivalent(a, str(trace.final_answer))
                 for a in answers]
        out = {"outcome": answer_score(trace.final_answer, task.answer), "round0_accuracy": sum(correct[0]) / self.n,
               "final_accuracy": sum(last) / self.n, "agreement": sum(agree) / max(1, len(agree))}
        out.update({f"debater_{i}/accuracy": v for i, v in enumerate(last)})
        return out
