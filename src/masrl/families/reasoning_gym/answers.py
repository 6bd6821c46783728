"""A worked example's answer that the dataset's own scorer gives full marks.

Most reasoning-gym entries carry their answer. The open-ended ones (several answers are right) carry
``None`` there, and a prompt that showed ``<answer>None</answer>`` taught the model a reply the scorer
gives 0. Their entries often carry a right answer elsewhere (``metadata.example_answer``,
``example_correct_answer``, ``possible_answer``); where none does (``rush_hour``, ``boxnet``), one is found
by a breadth-first search that moves with the library's own rules. Every candidate is checked by the
dataset's own ``score_answer`` before a prompt shows it.
"""

from __future__ import annotations

import copy
import json
from collections import deque
from typing import Any, Callable

MAX_STATES = 20_000  # a search gives up past this many positions (the example is then drawn again)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def worked_answer(ds, entry: dict) -> str | None:
    """An answer to ``entry`` that ``ds.score_answer`` scores 1.0, or None when none is found."""
    meta = entry.get("metadata") or {}
    found = [entry.get("answer"), meta.get("example_answer"), meta.get("example_correct_answer"),
             meta.get("possible_answer")]
    search = SEARCHES.get(meta.get("source_dataset", ""))
    for value in found:
        if value is not None and _full_marks(ds, _text(value), entry):
            return _text(value)
    if search is not None:
        value = search(entry)
        if value is not None and _full_marks(ds, value, entry):
            return value
    return None


def _full_marks(ds, answer: str, entry: dict) -> bool:
    try:
        return float(ds.score_answer(answer, entry)) >= 1.0
    except Exception:  # a scorer that cannot read this candidate: not an answer to show
        return False


def _bfs(start, moves: Callable, done: Callable, key: Callable):
    """The shortest list of moves from ``start`` to a state ``done`` accepts (None past ``MAX_STATES``)."""
    seen, queue = {key(start)}, deque([(start, [])])
    while queue and len(seen) < MAX_STATES:
        state, path = queue.popleft()
        if done(state):
            return path
        for move, nxt in moves(state):
            k = key(nxt)
            if k not in seen:
                seen.add(k)
                queue.append((nxt, path + [move]))
    return None


def _rush_hour(entry: dict) -> str | None:
    """Single-cell moves of any piece (``A+1``, ``C-1``), with the library's ``Board``."""
    from reasoning_gym.games.rush_hour import Board

    config = entry["metadata"]["board_config"]
    letters = sorted({c for c in config if c not in "ox"})

    def moves(board):
        for letter in letters:
            for step in (1, -1):
                nxt = copy.deepcopy(board)
                nxt.move(letter, step)
                yield f"{letter}{'+' if step > 0 else '-'}1", nxt

    path = _bfs(Board(config), moves, lambda b: b.solved, lambda b: tuple(p.position for p in b._pieces))
    return None if path is None else " ".join(path)


def _boxnet(entry: dict) -> str | None:
    """One agent's action a step (a box to a neighbouring square, or onto its target), with the library's
    own ``action_from_response``."""
    from reasoning_gym.games.boxnet import action_from_response

    def moves(state):
        for square, items in state.items():
            x, y = (float(v) for v in square.split("_"))
            agent = f"Agent[{x}, {y}]"
            for box in (i for i in items if i.startswith("box_")):
                if f"target_{box[4:]}" in items:
                    act = {agent: f"move({box}, target_{box[4:]})"}
                    yield act, action_from_response(state, [act])
                for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
                    if f"{x + dx}_{y + dy}" in state:
                        act = {agent: f"move({box}, square[{x + dx}, {y + dy}])"}
                        yield act, action_from_response(state, [act])

    def key(state):
        return tuple(sorted((k, tuple(sorted(v))) for k, v in state.items()))

    start = entry["metadata"]["initial_state"]
    path = _bfs(start, moves, lambda s: not any(i.startswith("box_") for v in s.values() for i in v), key)
    return None if path is None else json.dumps(path)


SEARCHES: dict[str, Callable[[dict], str | None]] = {"rush_hour": _rush_hour, "boxnet": _boxnet}
