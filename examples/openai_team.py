"""A two-agent team written with nothing but the official `openai` client.

A solver drafts an answer; a checker reads the question and the draft and states the final number.
The code is the same whether it talks to any OpenAI-compatible server or is being trained by masrl:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... python examples/openai_team.py "What is 7 + 5?"

masrl runs it unchanged (examples/external_openai_team.yaml: `command: [python, examples/openai_team.py]`),
setting OPENAI_BASE_URL to the episode's own base URL and the task in MASRL_TASK; each request's
`model` names the agent, which the config maps to a policy or a LoRA adapter. `run(task, base_url)`
is the same team as a function, for `workflow.options.agent: "openai_team:run"`.
"""

from __future__ import annotations

import json
import os
import re
import sys

from openai import OpenAI

SOLVER = ("You solve arithmetic word problems. Think briefly, then end with the answer as a number.\n"
          "Example: Q: Tom has 3 apples and buys 4 more. How many? A: 3 + 4 = 7. The answer is 7.")
CHECKER = ("You check a solution to an arithmetic word problem. Reply with only the correct final number.\n"
           "Example: Q: 5 minus 2? Draft: 5 - 2 = 3. The answer is 3. Final: 3")


def solve(question: str, client: OpenAI) -> str:
    draft = client.chat.completions.create(
        model="solver", max_tokens=64,
        messages=[{"role": "system", "content": SOLVER}, {"role": "user", "content": f"Q: {question} A:"}],
    ).choices[0].message.content or ""
    final = client.chat.completions.create(
        model="checker", max_tokens=16,
        messages=[{"role": "system", "content": CHECKER},
                  {"role": "user", "content": f"Q: {question} Draft: {draft.strip()} Final:"}],
    ).choices[0].message.content or ""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", final) or re.findall(r"-?\d+(?:\.\d+)?", draft)
    return numbers[0] if numbers else final.strip()


def run(task: dict, base_url: str) -> str:
    """masrl's function entry point: the same team, pointed at the episode's base URL."""
    return solve(task["question"], OpenAI(base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY", "masrl")))


if __name__ == "__main__":
    task = json.loads(os.environ["MASRL_TASK"]) if "MASRL_TASK" in os.environ else {"question": " ".join(sys.argv[1:])}
    print(solve(task["question"], OpenAI()))  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
