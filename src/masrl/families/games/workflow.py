"""Two or more players in a TextArena game, each an agent mapped to a policy in config (``workflow: textarena``).

    workflow:
      name: textarena
      options: {game: TicTacToe-v0-train, players: [player_0, player_1], swap_seats: false}

``players`` names the agent in each seat; the same policy behind both is self-play on one policy (the seat is in
the prompt and in the agent's name, so each seat has its own GRPO groups: a seat's advantage is not mistaken for
skill), two policies learn against each other, a frozen policy is a fixed opponent (the untrained model), and
``random`` is a built-in player that picks a random legal move (no model): a game's first sample (every held-out
game) draws its moves from the seed alone, every other sample of a group from its own stream, so that a group's
games against it differ even once the policy plays one move per position (a group of identical games has no
advantage to learn from). A seat written ``pool_0|pool_1|pool_2``
takes one of those agents per episode (by its seed): with each on a member of an opponent pool (policies with
``snapshot_of``, docs/games.md) the player meets its own past selves. ``swap_seats: true`` swaps the first two
seats every other episode of a split, so the first agent plays both seats, half the games each.

Each episode is one game from the task's seed (``source: episodes``): every move is one call of the agent whose
turn it is, on the library's own observation; the reply's bracketed move (``[4]``, ``[check]``) goes to the game,
which judges it by its own rules (an invalid move is asked again once, then loses the game). The prompt shows
``examples`` worked turns first (default 2): the game's own opening observation at seeds of their own, each
answered with one of the moves it lists, so that a small model sees the reply format (untrained SmolLM2-135M
answers a bare board in prose and loses every game by an invalid move). At the end each call
is credited its player's reward from the library (+1 win, -1 loss, 0 draw in two-player games; paid by the
``credit`` reward), and the format reward pays a reply that is one bracketed move.

Metrics, per agent (``<agent>/...``, from the traces where it played): ``score`` (win 1, draw 0.5, loss 0), ``win``,
``draw``, ``loss``, ``invalid`` (its moves the game refused), ``lost_by_invalid``, and ``seat0_score`` /
``seat1_score``. ``outcome`` is the first listed agent's score (of the split's own seating where it has one; of a
seat ``a|b``, the agent that played).
A split's ``options.opening_moves: N`` (source ``episodes``) starts each of its games after 0 to N random legal
moves, as many and which drawn by the game's seed, so one seed's games (a GRPO group) share their opening: self-play
then meets positions its own play never reaches (a second seat that only ever answered its own first move loses to
a random one). The opening's moves are no agent's calls (``agent: opening`` in ``trace.state``'s moves).
``options.explore_moves: p`` plays each move of an agent at random in its place with chance p, drawn by each
sample, so that a group's games part even once the policy plays one move per position, and each seat meets
positions its own opponent policy would not give it (``agent: explore``; no call, so none trains on it).
``trace.state`` keeps the moves and the winner, which
``masrl report`` shows with the calls.
"""

from __future__ import annotations

import random
from typing import Any

from masrl.agents import AgentRole
from masrl.data.tasks import Task
from masrl.errors import ConfigError
from masrl.families.games import arena, spiel, zoo
from masrl.parsing import ParseResult
from masrl.trace import Trace
from masrl.workflows.prompting import few_shot

RANDOM = "random"
SYSTEM = ("You are {seat} in a game of {game}. Read the game and reply with your next move only: one of the "
          "available moves, in square brackets, exactly as the game writes it (for example {example}).")


def parse_move(text: str) -> ParseResult:
    """A reply that is one bracketed move: ``[4]``, ``[check]``, ``[0 3]`` (partial credit for a move with more text)."""
    import re

    found = re.findall(r"\[[^\[\]]{1,60}\]", text)
    if not found:
        return ParseResult(False, 0.0, {}, ["no bracketed move"])
    whole = text.strip() == found[0]
    return ParseResult(whole, 1.0 if whole else 0.5, {"move": found[0]}, [] if whole else ["text around the move"])


def _builtin(agent: str) -> bool:
    """A seat played by masrl itself, no model: ``random``, or (OpenSpiel) ``minimax`` / ``minimax@p``."""
    return agent == RANDOM or spiel.parse_builtin(agent) is not None


def check_seating(options: dict, key: str) -> None:
    """A split's seating (source ``episodes``' ``options``), each key's type: ``players`` (the agent in each seat,
    for this split's games) and ``swap_seats``, checked against the game's agents by ``check_split``;
    ``opening_moves``: each game starts after 0 to that many random legal moves, as many and which drawn by its seed
    (self-play that meets new positions, docs/games.md); ``explore_moves``: the chance that a move of an agent is
    played at random in its place (drawn by each sample)."""
    unknown = sorted(set(options) - {"players", "swap_seats", "opening_moves", "explore_moves"})
    if unknown:
        raise ConfigError(f"{key}.options: source 'episodes' takes players, swap_seats (a split's seating, read by "
                          f"the workflows that seat players), opening_moves and explore_moves, not {', '.join(unknown)}")
    rate = options.get("explore_moves", 0)
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate < 1:
        raise ConfigError(f"{key}.options.explore_moves: a chance from 0 up to (not including) 1 that an agent's "
                          f"move is played at random in its place (e.g. 0.1), not {rate!r}")
    opening = options.get("opening_moves", 0)
    if not isinstance(opening, int) or isinstance(opening, bool) or not 0 <= opening <= 20:
        raise ConfigError(f"{key}.options.opening_moves: a whole number of moves, 0-20 (each game of the split "
                          f"starts with up to that many random legal moves, drawn by its seed), not {opening!r}")
    players = options.get("players")
    if players is not None and (not isinstance(players, list) or len(players) < 1
                                or not all(isinstance(p, str) and p for p in players)):
        raise ConfigError(f"{key}.options.players: a list of agent names, one per seat (e.g. [player_0, random])")
    if not isinstance(options.get("swap_seats", False), bool):
        raise ConfigError(f"{key}.options.swap_seats: true or false")



class TextArenaGame:
    name = "textarena"
    lib = arena  # the game library: start an episode, observe, move, legal moves (arena, spiel, zoo share the face)
    label = "TextArena"

    def __init__(self, game: str = "TicTacToe-v0-train", players: list[str] | None = None, swap_seats: bool = False,
                 max_moves: int = 100, max_new_tokens: int = 12, example: str | None = "[4]", examples: int = 2):
        self.game, self.players = game, list(players or ["player_0", "player_1"])
        self.swap_seats, self.max_moves, self.max_new_tokens = swap_seats, max_moves, max_new_tokens
        if not 0 <= examples <= 4:
            raise ConfigError("workflow.options.examples: 0-4 worked turns")
        self.options = [[a.strip() for a in str(p).split("|")] for p in self.players]  # each seat's agents
        agents = [a for opts in self.options for a in opts if not _builtin(a)]
        if not agents:
            raise ConfigError("workflow.options.players: at least one seat needs an agent (not every seat 'random')")
        if len(set(agents)) != len(agents):
            raise ConfigError(f"workflow.options.players: {self.players} gives one agent two seats; give each seat its "
                              f"own agent (for self-play map both agents to one policy) so that each seat has its own "
                              f"baseline")
        if max_moves < 1:
            raise ConfigError("workflow.options.max_moves must be at least 1")
        self.lib.check_game(game, len(self.players))
        self.moves_known = self.lib.moves_known(game, len(self.players))
        if examples and not self.moves_known:
            raise ConfigError(self._no_moves("workflow.options.examples", f"shows {examples} worked turns", "set "
                                             "workflow.options.examples: 0 (the prompt then shows the game's own rules "
                                             "alone)"))
        self._check_builtins([a for opts in self.options for a in opts], "workflow.options.players")
        self.shots = self._worked_turns(examples)
        self.example = example or (self.shots[0][1] if self.shots else self._first_move())

    def _no_moves(self, key: str, what: str, fix: str) -> str:
        return (f"{key} {what}, each a legal move, but TextArena's {self.game} lists no moves on its screen and masrl "
                f"reads the legal moves from the state of {', '.join(arena.STATE_MOVES).replace('Env', '')} only; {fix}")

    def _worked_turns(self, n: int) -> list[tuple[str, str]]:
        """``n`` worked turns for the prompt: the game's opening observation at seeds of their own (the library's
        ``EXAMPLE_SEED`` on), each answered with a legal move (``moves_known`` is checked first)."""
        out = []
        for k in range(n):
            seed = self.lib.EXAMPLE_SEED + k
            g = self.lib.Game(self.game, len(self.players), seed).start()
            _, obs = g.observe()
            out.append((obs, self.lib.random_move(g, obs, random.Random(seed))))
        return out

    def _first_move(self) -> str:
        g = self.lib.Game(self.game, len(self.players), self.lib.EXAMPLE_SEED).start()
        moves = self.lib.legal_moves(g, g.observe()[1], strict=False)
        return moves[0] if moves else "[4]"

    def _check_builtins(self, agents: list[str], key: str) -> None:
        """The built-in players among ``agents`` can play this game."""
        if RANDOM in agents:
            self._refuse_random(key)
        for a in agents:
            if a == RANDOM or not _builtin(a):
                continue
            if self.lib is not spiel:
                raise ConfigError(f"{key}: '{a}' is a built-in player of OpenSpiel games (workflow: openspiel); "
                                  f"{self.label} games seat agents or 'random'")
            why = spiel.minimax_ok(self.game)
            if why:
                raise ConfigError(f"{key}: the minimax player '{a}' cannot play: {why}")

    def _refuse_random(self, key: str) -> None:
        if not self.moves_known:
            raise ConfigError(self._no_moves(key, "seats the random player, who plays", "seat an agent (a frozen "
                                             "policy is a fixed opponent) or pick a game that lists its moves"))

    def roles(self) -> dict[str, AgentRole]:
        return {a: AgentRole(a, parse_move, "plays a seat of the game", self.max_new_tokens, ("]",))
                for opts in self.options for a in opts if not _builtin(a)}

    def seats(self, seed: int, meta: dict | None = None) -> list[str]:
        """The agent in each seat for the episode of ``seed``: one of a seat's agents (``a|b``) drawn by the seed,
        the first two seats swapped every other episode (by its place in the split, else by its seed). A split's own
        seating (``data.eval.options.players`` and ``swap_seats`` of source ``episodes``, in ``meta``) replaces the
        workflow's for its games."""
        meta = meta or {}
        options = self._listed(meta)
        swap = bool(meta.get("swap_seats", self.swap_seats)) if meta.get("players") else self.swap_seats
        order = [opts[0] if len(opts) == 1 else random.Random(f"seat-{seed}-{i}").choice(opts)
                 for i, opts in enumerate(options)]
        if swap and len(order) >= 2 and meta.get("index", seed) % 2 == 1:  # every other game of a split
            order[0], order[1] = order[1], order[0]
        return order

    def _listed(self, meta: dict) -> list[list[str]]:
        """Each seat's agents: the split's own seating where its tasks carry one, else the workflow's."""
        return self._seating(meta["players"]) if meta.get("players") else self.options

    @staticmethod
    def _seating(players: list[str]) -> list[list[str]]:
        return [[a.strip() for a in str(p).split("|")] for p in players]

    def check_split(self, split, key: str) -> None:
        """A split's own seating (source ``episodes``, ``options.players``): as many seats as the game's, and only
        this workflow's agents (or ``random``) in them, so that every seat's agent has a policy; random moves
        (the random player, openings, ``explore_moves``) only in a game whose legal moves are known."""
        opts = (split.options or {}) if split.source == "episodes" else {}
        check_seating(opts, key)
        for name in ("opening_moves", "explore_moves"):
            if opts.get(name) and not self.moves_known:
                raise ConfigError(self._no_moves(f"{key}.options.{name}", "plays random moves", "remove it"))
        players = opts.get("players")
        if not players:
            return
        self._check_builtins([a for seat in self._seating(players) for a in seat], f"{key}.options.players")
        if len(players) != len(self.players):
            raise ConfigError(f"{key}.options.players: {len(players)} seats, but the game is played with "
                              f"{len(self.players)} (workflow.options.players); give one agent per seat")
        known = set(self.roles())
        named = [a for opts in self._seating(players) for a in opts if not _builtin(a)]
        unknown = [a for a in named if a not in known]
        if unknown:
            raise ConfigError(f"{key}.options.players: no agent {', '.join(map(repr, unknown))} in this game (its "
                              f"agents: {', '.join(sorted(known))}, or 'random'); every seat needs an agent with a policy")
        if not named:
            raise ConfigError(f"{key}.options.players: at least one seat needs an agent (not every seat 'random')")
        if len(set(named)) != len(named):
            raise ConfigError(f"{key}.options.players: {players} gives one agent two seats; give each seat its own")

    async def run(self, task: Task, ctx) -> None:
        seed = int(task.meta.get("seed", 0))
        seats = self.seats(seed, task.meta)
        game = self.lib.Game(self.game, len(seats), seed).start()
        rng = random_player(seed, ctx.trace.sample_idx)
        calls: dict[int, list] = {i: [] for i in range(len(seats))}
        moves: list[dict[str, Any]] = []
        invalid = {i: 0 for i in range(len(seats))}
        opening = random.Random(f"textarena-opening-{seed}")  # a group's games (one seed) share their opening
        for _ in range(opening.randint(0, int(task.meta.get("opening_moves", 0)))):
            if game.done:
                break
            pid, obs = game.observe()
            action = self.lib.random_move(game, obs, opening)
            game.move(pid, action)
            moves.append({"seat": pid, "agent": "opening", "move": action, "invalid": False})
        rate = float(task.meta.get("explore_moves", 0))
        explore = random.Random(f"textarena-explore-{seed}-{ctx.trace.sample_idx}")
        while not game.done:
            if len(moves) >= self.max_moves:
                raise self.lib.ArenaError(f"{self.label} '{self.game}' (seed {seed}) did not end within {self.max_moves} "
                                       f"moves (workflow.options.max_moves)")
            pid, obs = game.observe()
            agent = seats[pid]
            if agent == RANDOM:
                action = self.lib.random_move(game, obs, rng)
            elif _builtin(agent):
                action = spiel.builtin_move(agent, game, obs, rng)
            elif rate and explore.random() < rate:
                agent, action = "explore", self.lib.random_move(game, obs, explore)
            else:
                call = await ctx.call(agent, self._messages(pid, obs), turn=len(calls[pid]),
                                      state=_position(self.game, pid, obs))
                calls[pid].append(call)
                action = call.parsed.get("move") or (call.completion or "").strip()
            bad = game.move(pid, action)
            invalid[pid] += int(bad)
            moves.append({"seat": pid, "agent": agent, "move": action, "invalid": bad})
        for pid, made in calls.items():
            for call in made:  # every move of a player is paid its game's result
                call.credit = game.rewards.get(pid, 0.0)
        ctx.state.update(seats=seats, moves=moves, rewards={str(k): v for k, v in game.rewards.items()},
                         invalid=invalid, reason=_reason(game.info))
        ctx.finish(self._verdict(seats, game.rewards))

    def _messages(self, pid: int, obs: str) -> list[dict[str, str]]:
        system = SYSTEM.format(seat=f"Player {pid}", game=self.game.split("-v")[0], example=self.example)
        return few_shot(system, self.shots, obs)

    @staticmethod
    def _verdict(seats: list[str], rewards: dict[int, float]) -> str:
        if not rewards:
            return "no result"
        best = max(rewards.values())
        winners = [pid for pid, r in rewards.items() if r == best]
        if len(winners) == len(rewards):
            return "draw"
        return ", ".join(f"Player {pid} ({seats[pid]})" for pid in winners) + " wins"

    def score(self, trace: Trace, task: Task) -> dict[str, float]:
        seats = trace.state.get("seats") or self.seats(int(task.meta.get("seed", 0)), task.meta)
        rewards = {int(k): v for k, v in (trace.state.get("rewards") or {}).items()}
        invalid = {int(k): v for k, v in (trace.state.get("invalid") or {}).items()}
        moves = trace.state.get("moves") or []
        out: dict[str, float] = {}
        for pid, agent in enumerate(seats):
            if _builtin(agent):
                continue
            result = _result(pid, rewards)
            made = sum(1 for m in moves if m["seat"] == pid and m["agent"] != "opening")
            out.update({f"{agent}/score": result, f"{agent}/win": float(result == 1.0), f"{agent}/draw": float(result == 0.5),
                        f"{agent}/loss": float(result == 0.0), f"{agent}/invalid": invalid.get(pid, 0) / made if made else 0.0,
                        f"{agent}/lost_by_invalid": float(bool(moves) and moves[-1]["seat"] == pid and moves[-1]["invalid"]
                                                          and result == 0.0),
                        f"{agent}/seat{pid}_score": result})
        listed = self._listed(task.meta)
        # the first listed seat's agent as this game drew it (of ``a|b``, the one that played), so that a pooled
        # seat's games are not counted as losses of the agent that sat out
        first = next((a for opts in listed for a in opts if not _builtin(a) and a in seats),
                     next(a for opts in listed for a in opts if not _builtin(a)))
        out["outcome"] = out.get(f"{first}/score", 0.0)
        out["moves"] = float(len(moves))
        return out


def _position(game: str, pid: int, obs: str) -> str:
    """A short name for what seat ``pid`` sees (``algorithm.group_key: [agent, state]`` groups moves by it)."""
    import hashlib

    return hashlib.sha1(f"{game}|{pid}|{obs}".encode()).hexdigest()[:16]


def random_player(seed: int, sample_idx: int = 0) -> random.Random:
    """The random player's draws in the game of ``seed``: sample 0 (every held-out game) the seed's own, each other
    sample of a training group its own stream."""
    return random.Random(f"textarena-random-{seed}" if sample_idx == 0 else f"textarena-random-{seed}-{sample_idx}")


def _result(pid: int, rewards: dict[int, float]) -> float:
    """1 for a win (the best reward, alone), 0.5 for a draw (the best, shared by all), 0 for a loss."""
    if not rewards or pid not in rewards:
        return 0.0
    best = max(rewards.values())
    if rewards[pid] < best:
        return 0.0
    return 0.5 if all(r == best for r in rewards.values()) else 1.0


def _reason(info: dict) -> str:
    for v in info.values():
        if isinstance(v, dict) and v.get("reason"):
            return str(v["reason"])
    return str(info.get("reason", ""))


class OpenSpielGame(TextArenaGame):
    """Any OpenSpiel game played in turns (``workflow: openspiel``), seated, prompted, credited and scored as a
    TextArena game is; ``minimax`` and ``minimax@p`` are built-in players where OpenSpiel solves the game."""

    name = "openspiel"
    lib = spiel
    label = "OpenSpiel"

    def __init__(self, game: str = "tic_tac_toe", players: list[str] | None = None, swap_seats: bool = False,
                 max_moves: int = 200, max_new_tokens: int = 12, example: str | None = None, examples: int = 2):
        super().__init__(game, players, swap_seats, max_moves, max_new_tokens, example, examples)

    async def yardsticks(self, trainer) -> dict:
        """Exploitability (small imperfect-information games) and the minimax ladder (games OpenSpiel solves) of
        the first agent's policy, by OpenSpiel's own code (``yardsticks``)."""
        from masrl.families.games import yardsticks

        return await yardsticks.measure(self, trainer)

    def _messages(self, pid: int, obs: str) -> list[dict[str, str]]:
        name = self.game.split("(")[0].replace("_", " ")
        system = SYSTEM.format(seat=f"Player {pid}", game=name, example=self.example)
        return few_shot(system, self.shots, obs)


class PettingZooGame(TextArenaGame):
    """Any PettingZoo AEC game (``workflow: pettingzoo``), seated, prompted, credited and scored as a TextArena
    game is; the legal moves are the action mask's open actions (``zoo``)."""

    name = "pettingzoo"
    lib = zoo
    label = "PettingZoo"

    def __init__(self, game: str = "tictactoe_v3", players: list[str] | None = None, swap_seats: bool = False,
                 max_moves: int = 500, max_new_tokens: int = 12, example: str | None = None, examples: int = 2):
        super().__init__(game, players, swap_seats, max_moves, max_new_tokens, example, examples)

    def _messages(self, pid: int, obs: str) -> list[dict[str, str]]:
        name = self.game.rsplit(".", 1)[-1].rsplit("_v", 1)[0].replace("_", " ")
        system = SYSTEM.format(seat=f"Player {pid}", game=name, example=self.example)
        return few_shot(system, self.shots, obs)
