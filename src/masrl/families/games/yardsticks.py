"""Exact yardsticks for a policy that plays an OpenSpiel game, computed by OpenSpiel's own code (``masrl eval``).

- ``exploitability`` (NashConv / 2 in a two-player game: how much a best response wins against the policy, averaged
  over the seats; 0 at a Nash equilibrium): the policy's probability of each legal move at every information state
  is read from the model's own logprobs of that move's reply (``[Bet]``), no sampling, normalised over the legal
  moves, and handed to ``open_spiel.python.algorithms.exploitability``. Beside it the uniform-random policy's
  (Kuhn Poker 0.458, Leduc Poker 2.374). For games of at most ``MAX_INFO_STATES`` information states (Kuhn 12,
  Leduc 936); the policy itself, each information state's move probabilities (the library's information-state
  string), is kept beside the number for a game of at most ``TABLE_STATES`` of them.
- ``ladder``: held-out games against the minimax player that plays a random move with probability p (``LADDER``:
  1.0 is the random player, 0 perfect play), both seats, win / draw / loss per seat; for games OpenSpiel solves
  here (tic_tac_toe).

Each yardstick measures a policy playing both seats: the policy of the first agent the workflow seats (in
self-play both seats' agents share it).
"""

from __future__ import annotations

import contextlib
import math

from masrl.families.games import spiel

MAX_INFO_STATES = 5_000
LADDER = (1.0, 0.5, 0.2, 0.0)
TABLE_STATES = 64  # a game with at most this many information states has its policy table in the result (Kuhn: 12)


def uniform_exploitability(game: str) -> float:
    from open_spiel.python import policy as sp_policy
    from open_spiel.python.algorithms import exploitability

    g = spiel.load(game)
    return float(exploitability.exploitability(g, sp_policy.TabularPolicy(g)))


def exploitability_of(game: str, probs) -> float:
    """Exploitability of the policy that ``probs(state, pid, actions) -> [p per action]`` describes."""
    from open_spiel.python import policy as sp_policy
    from open_spiel.python.algorithms import exploitability

    g = spiel.load(game)
    table = sp_policy.TabularPolicy(g)
    for i, state in enumerate(table.states):
        actions = state.legal_actions()
        ps = probs(state, state.current_player(), actions)
        table.action_probability_array[i, :] = 0.0
        for a, p in zip(actions, ps):
            table.action_probability_array[i, a] = p
    return float(exploitability.exploitability(g, table))


def info_state_count(game: str) -> int:
    from open_spiel.python import policy as sp_policy

    return len(sp_policy.TabularPolicy(spiel.load(game)).states)


def exploitable(game: str) -> str | None:
    """Why exploitability is not computed for ``game`` (None when it is)."""
    pyspiel = spiel.library()
    g = spiel.load(game)
    if g.num_players() != 2 or g.get_type().utility != pyspiel.GameType.Utility.ZERO_SUM:
        return "not a two-player zero-sum game"
    if g.get_type().information == pyspiel.GameType.Information.PERFECT_INFORMATION:
        return "a game of perfect information (the minimax ladder measures it)"
    n = info_state_count(game)
    if n > MAX_INFO_STATES:
        return f"{n} information states (at most {MAX_INFO_STATES} are scored)"
    return None


def normalised(logps: list[float]) -> list[float]:
    """Probabilities from the logprobs of the legal moves' replies (their mass renormalised to 1)."""
    top = max(logps)
    ws = [math.exp(x - top) for x in logps]
    return [w / sum(ws) for w in ws]


def model_probs(workflow, trainer, agent: str):
    """``probs(state, pid, actions)`` of ``agent``'s policy: each legal move's reply scored by the policy."""
    from masrl.worker.sampler.prompts import PromptRenderer
    from masrl.worker.updater.batching import Sample

    spec = trainer.rt.agents[agent]
    worker = next(w for w in trainer.rt.workers if spec.policy in w.policy_names)
    tok = worker.get_tokenizer()
    renderer = PromptRenderer(tok)

    def probs(state, pid, actions):
        obs = spiel.render(state, pid, workflow.game)
        _, prompt = renderer.render(workflow._messages(pid, obs), spec.template_kwargs)
        samples = [Sample(f"yardstick-{pid}-{a}", spec.policy, prompt,
                          tok.encode(spiel.bracket(state.action_to_string(pid, a)), add_special_tokens=False),
                          [], 1.0, {}) for a in actions]
        scored = worker.score(spec.policy, samples)
        return normalised([sum(lp) for lp in scored])
    return probs


def first_agent(workflow) -> str:
    return next(a for opts in workflow.options for a in opts if spiel.parse_builtin(a) is None and a != "random")


async def measure(workflow, trainer) -> dict:
    """The yardsticks that apply to ``workflow``'s game, for its first agent's policy."""
    import asyncio
    import dataclasses

    agent, out = first_agent(workflow), {}
    if exploitable(workflow.game) is None:
        with contextlib.ExitStack() as stack:
            for w in trainer.rt.workers:
                stack.enter_context(w.evaluating())
            probs, table = model_probs(workflow, trainer, agent), {}

            def kept(state, pid, actions):  # each information state's move probabilities, for the record
                ps = probs(state, pid, actions)
                table[state.information_state_string(pid)] = {
                    state.action_to_string(pid, a): round(p, 4) for a, p in zip(actions, ps)}
                return ps
            value = await asyncio.to_thread(exploitability_of, workflow.game, kept)
        out["exploitability"] = {"agent": agent, "policy": value, "uniform": uniform_exploitability(workflow.game)}
        if len(table) <= TABLE_STATES:
            out["exploitability"]["table"] = table
    if spiel.minimax_ok(workflow.game) is None:
        kept, rungs = trainer.last_eval_traces, {}
        for p in LADDER:  # the held-out games (their seeds), reseated: the agent against minimax@p, both seats
            seating = {"players": [agent, f"minimax@{p:g}"], "swap_seats": True}
            tasks = [dataclasses.replace(t, id=f"{t.id}-ladder-{p:g}", meta={**t.meta, **seating})
                     for t in trainer.eval_tasks]
            await trainer.evaluate(label=f"ladder-{p:g}", tasks=tasks)
            rungs[f"{p:g}"] = seat_results(trainer.last_eval_traces, agent)
        trainer.last_eval_traces = kept
        out["ladder"] = {"agent": agent, "random_move_probability": rungs}
    out["lines"] = lines(out)
    return out


def seat_results(traces, agent: str) -> dict:
    """Win / draw / loss of ``agent`` in each seat it played (failed games count as losses)."""
    out: dict[str, dict[str, float]] = {}
    for tr in traces:
        seats = tr.state.get("seats") or []
        if agent not in seats:
            continue
        pid = seats.index(agent)
        rewards = {int(k): v for k, v in (tr.state.get("rewards") or {}).items()}
        if tr.failed or pid not in rewards:
            result = "loss"
        else:
            best = max(rewards.values())
            result = "loss" if rewards[pid] < best else ("draw" if all(r == best for r in rewards.values()) else "win")
        row = out.setdefault(f"seat{pid}", {"games": 0, "win": 0, "draw": 0, "loss": 0})
        row["games"] += 1
        row[result] += 1
    for row in out.values():
        for k in ("win", "draw", "loss"):
            row[k] = row[k] / row["games"]
    return out


def lines(result: dict) -> list[str]:
    """The yardsticks as console lines."""
    out = []
    if "exploitability" in result:
        e = result["exploitability"]
        out.append(f"  exploitability of {e['agent']}: {e['policy']:.4f} (uniform random {e['uniform']:.4f}; Nash 0)")
    if "ladder" in result:
        lad = result["ladder"]
        for p, seats in lad["random_move_probability"].items():
            cells = "  ".join(f"{s}: W {r['win']:.2f} D {r['draw']:.2f} L {r['loss']:.2f} ({r['games']})"
                              for s, r in sorted(seats.items()))
            out.append(f"  {lad['agent']} vs minimax@{p}: {cells}")
    return out
