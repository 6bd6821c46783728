"""A LangGraph graph of two agents, trained unchanged by masrl, each on its own LoRA adapter.

A planner reads the problem and writes the steps; a solver follows them and states the answer. The
graph uses langchain-openai's ChatOpenAI, which talks to whatever OPENAI_BASE_URL points at:

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=... python examples/langgraph_team.py "What is 7 + 5?"

masrl runs it unchanged (examples/external_langgraph_lora.yaml: `command: [python, examples/langgraph_team.py]`)
with OPENAI_BASE_URL set to the episode's base URL; `model` names the agent, and the config puts each
agent on its own LoRA adapter of one frozen base. `run(task, base_url)` is the same graph as a function.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import TypedDict

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph


class State(TypedDict, total=False):
    question: str
    plan: str
    answer: str


def build(base_url: str | None = None):
    """The graph; ``base_url`` None: the client's own default (OPENAI_BASE_URL)."""
    kw = {"base_url": base_url, "api_key": os.environ.get("OPENAI_API_KEY", "masrl")} if base_url else {}
    planner = ChatOpenAI(model="planner", max_tokens=48, **kw)
    solver = ChatOpenAI(model="solver", max_tokens=32, **kw)

    def plan(state: State) -> State:
        msg = planner.invoke([SystemMessage("List the arithmetic steps for the problem, briefly."),
                              HumanMessage(state["question"])])
        return {"plan": str(msg.content)}

    def solve(state: State) -> State:
        msg = solver.invoke([SystemMessage("Follow the steps and end with: The answer is N."),
                             HumanMessage(f"{state['question']}\nSteps: {state['plan']}")])
        numbers = re.findall(r"-?\d+(?:\.\d+)?", str(msg.content))
        return {"answer": numbers[-1] if numbers else str(msg.content).strip()}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("solve", solve)
    g.add_edge(START, "plan")
    g.add_edge("plan", "solve")
    g.add_edge("solve", END)
    return g.compile()


def run(task: dict, base_url: str) -> str:
    """masrl's function entry point: the same graph against the episode's base URL."""
    return build(base_url).invoke({"question": task["question"]})["answer"]


if __name__ == "__main__":
    task = json.loads(os.environ["MASRL_TASK"]) if "MASRL_TASK" in os.environ else {"question": " ".join(sys.argv[1:])}
    print(build().invoke({"question": task["question"]})["answer"])
