"""Buffered calls (Sample) and how the trainer lays them out for a forward pass.

Three layouts of one micro-batch, all producing logprobs of exactly the sampled tokens:

* ``prefix`` (CPU default): the prompt prefix every row shares (an agent's system prompt and
  worked examples) runs once; the rest of each row is right-padded after it, with an explicit mask.
* ``padded``: rows right-padded, plain causal attention (flash kernels on CUDA). Micro-batches
  are filled with rows of similar length, so padding stays small.
* ``packed`` (CUDA default): rows laid end to end in one sequence, no padding at all; attention
  stays inside each row (varlen flash attention).

Tensors are built on the host and moved to the device in one copy each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from masrl.modeling.lean import Packed, causal_mask
from masrl.modeling.prefix import common_prefix_len, group_by_prefix


@dataclass
class Sample:
    """A served call as its worker keeps it: the exact tokens sampled and their logprobs."""

    call_id: str
    policy: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]  # from the rollout engine
    temperature: float
    key: dict  # task_id, agent, turn, sample_idx, trace_id
    reward: float | None = None
    train_reward: float | None = None  # the reward the estimator used (after ``algorithm.reward_norm``)
    advantage: float = 0.0
    token_adv: list[float] | None = None  # token-level estimators (GAE)
    returns: list[float] | None = None
    old_values: list[float] | None = None
    ref_logprobs: list[float] | None = None
    old_logprobs: list[float] | None = None  # the trainer's own, before the update (truncated IS)
    is_cap: float | None = None  # set on another policy's call shared into this update: its IS weight cap
    version: int = 0  # the policy's weight version that sampled it

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


@dataclass
class Batch:
    ids: torch.Tensor  # [B, S] rest of prompt + completion per row, or [1, T] packed
    positions: torch.Tensor  # same shape as ids
    mask: torch.Tensor | None  # [B, 1, S, P+S] bool (prefix layout); None: causal
    prefix: torch.Tensor  # [1, P] tokens shared by every row (P may be 0)
    packed: Packed | None
    select: torch.Tensor  # [N] flat positions (into ids) whose hidden state predicts a completion token
    dest: torch.Tensor  # [N] flat positions into [B, T] of those tokens
    tokens: torch.Tensor  # [N] the completion tokens
    token_temps: torch.Tensor  # [N] sampling temperature of each token's row
    token_mask: torch.Tensor  # [B, T] float: 1 on completion tokens
    n_rows: int
    width: int  # T, the longest completion


def pad_rows(rows: list[list[float]], T: int, device=None) -> torch.Tensor:
    out = torch.zeros((len(rows), T), dtype=torch.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out.to(device) if device is not None else out


def _shared_prefix(samples: list[Sample], min_prefix: int) -> int:
    if len(samples) < 2:
        return 0
    P = min(len(s.prompt_ids) for s in samples) - 1
    first = samples[0].prompt_ids
    for s in samples[1:]:
        P = min(P, common_prefix_len(first, s.prompt_ids))
    return P if P >= min_prefix else 0


def make_batch(samples: list[Sample], pad_id: int, *, layout: str = "prefix", device="cpu",
               min_prefix: int = 16) -> Batch:
    B = len(samples)
    T = max(len(s.completion_ids) for s in samples)
    P = _shared_prefix(samples, min_prefix) if layout == "prefix" else 0
    rests = [s.prompt_ids[P:] + s.completion_ids for s in samples]
    select, dest, tokens, temps = [], [], [], []
    token_mask = torch.zeros((B, T), dtype=torch.float32)
    if layout == "packed":
        S = sum(len(r) for r in rests)
        ids = torch.tensor([[t for r in rests for t in r]], dtype=torch.long)
        positions = torch.tensor([[p for r in rests for p in range(len(r))]], dtype=torch.long)
        cu = [0]
        for r in rests:
            cu.append(cu[-1] + len(r))
        packed = Packed(torch.tensor(cu, dtype=torch.int32).to(device), max(len(r) for r in rests))
        offsets = cu[:-1]
    else:
        S = max(len(r) for r in rests)
        ids = torch.full((B, S), pad_id, dtype=torch.long)
        for i, r in enumerate(rests):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        positions = (P + torch.arange(S)).unsqueeze(0).expand(B, -1).contiguous()
        packed = None
        offsets = [i * S for i in range(B)]
    for i, s in enumerate(samples):
        c = len(s.completion_ids)
        first = len(s.prompt_ids) - P - 1  # the hidden state before the first completion token
        select += range(offsets[i] + first, offsets[i] + first + c)
        dest += range(i * T, i * T + c)
        tokens += s.completion_ids
        temps += [s.temperature if s.temperature > 0 else 1.0] * c
        token_mask[i, :c] = 1.0
    mask = None
    if layout == "prefix":
        valid = torch.zeros((B, P + S), dtype=torch.bool)
        valid[:, :P] = True
        for i, r in enumerate(rests):
            valid[i, P : P + len(r)] = True
        mask = causal_mask(valid.to(device), P, S)
    return Batch(
        ids=ids.to(device), positions=positions.to(device), mask=mask,
        prefix=torch.tensor([samples[0].prompt_ids[:P]], dtype=torch.long).to(device), packed=packed,
        select=torch.tensor(select, dtype=torch.long).to(device), dest=torch.tensor(dest, dtype=torch.long).to(device),
        tokens=torch.tensor(tokens, dtype=torch.long).to(device),
        token_temps=torch.tensor(temps, dtype=torch.float32).to(device), token_mask=token_mask.to(device),
        n_rows=B, width=T,
    )


def micro_batches(samples: list[Sample], size: int, *, layout: str = "prefix",
                  token_budget: int | None = None) -> list[list[Sample]]:
    """Split ``samples`` into forward/backward chunks.

    ``prefix``: chunks of at most ``size`` rows that share a prompt prefix (the few-shot part of
    one agent's prompt), so each runs that prefix once: rows grouped by their longest shared prefix
    or by length under their agent's system prompt, whichever runs fewer tokens (``prefix_cost``). With
    ``token_budget``: chunks of rows that share a prefix, up to that many tokens counting the shared
    prefix once (``prefix_budget_chunks``). ``padded`` / ``packed``: rows sorted by length and filled
    greedily, up to ``size`` rows or, when ``token_budget`` is set, up to that many tokens (padded:
    rows x longest row; packed: the sum).
    """
    if layout == "prefix" and token_budget is not None:
        return prefix_budget_chunks(samples, token_budget)
    if layout == "prefix":  # whichever of two groupings runs fewer tokens
        return min(_prefix_chunks(samples, size), _length_chunks(samples, size),
                   key=lambda chunks: sum(prefix_cost(c) for c in chunks))

    def fits(cur: list[Sample], s: Sample) -> bool:
        n = len(cur) + 1
        cost = sum(x.length for x in cur) + s.length if layout == "packed" else n * cur[0].length
        return cost <= token_budget if token_budget is not None else n <= size

    return _fill(sorted(samples, key=lambda s: s.length, reverse=True), fits)


def _fill(order: list[Sample], fits) -> list[list[Sample]]:
    """``order`` cut into chunks: a row joins the current chunk while ``fits(chunk, row)``, else starts one."""
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in order:
        if cur and not fits(cur, s):
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def _prefix_chunks(samples: list[Sample], size: int, min_prefix: int = 16) -> list[list[Sample]]:
    """Rows in token order, so each chunk shares the longest prefix (a GRPO group's prompt, and an
    episode's next turns after it); leftovers without one length-sorted."""
    groups = group_by_prefix([s.prompt_ids for s in samples], min_prefix=min_prefix, max_group=size)
    out, singles = [], []
    for rows, plen in groups:
        if plen > 0:
            out.append([samples[i] for i in rows])
        else:
            singles.extend(samples[i] for i in rows)
    singles.sort(key=lambda s: s.length)
    return out + [singles[i : i + size] for i in range(0, len(singles), size)]


def _length_chunks(samples: list[Sample], size: int, min_prefix: int = 16) -> list[list[Sample]]:
    """Rows by the head of their prompt (one agent's system prompt), then by length: chunks share only
    that head but pad little. An agent's first turns (short) and later turns (the conversation so far)
    in separate chunks run fewer tokens than each episode's turns together, padded to the longest."""
    def head(s: Sample) -> list[int]:
        return s.prompt_ids[:min_prefix]

    return _fill(sorted(samples, key=lambda s: (head(s), s.length)),
                 lambda cur, s: len(cur) < size and head(s) == head(cur[0]))


def prefix_cost(samples: list[Sample], min_prefix: int = 16) -> int:
    """Tokens a ``prefix``-layout micro-batch of ``samples`` runs: the shared prefix once, then every row
    padded to the longest rest (what ``make_batch`` lays out)."""
    P = _shared_prefix(samples, min_prefix)
    return P + len(samples) * (max(s.length for s in samples) - P)


def prefix_budget_chunks(samples: list[Sample], token_budget: int, min_prefix: int = 16) -> list[list[Sample]]:
    """Chunks of at most ``token_budget`` tokens in the ``prefix`` layout (at least one row each).

    A row joins the chunk while the chunk's cost (``prefix_cost``, kept as rows join) stays within the
    budget; rows taken in prompt order (the samples of one call, a GRPO group, sit together, then calls
    that share only the system prompt: eight samples of one 2,900-token prompt run it once instead of
    eight times) or by length under their system prompt (a multi-turn agent's first turns apart from its
    longer later ones), whichever runs fewer tokens."""
    return min(_budget_chunks(sorted(samples, key=lambda s: (s.prompt_ids, s.length)), token_budget, min_prefix),
               _budget_chunks(sorted(samples, key=lambda s: (s.prompt_ids[:min_prefix], s.length)), token_budget,
                              min_prefix),
               key=lambda chunks: sum(prefix_cost(c, min_prefix) for c in chunks))


def _budget_chunks(order: list[Sample], token_budget: int, min_prefix: int) -> list[list[Sample]]:
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    lcp = longest = 0
    for s in order:
        if cur:
            shared = min(lcp, common_prefix_len(cur[0].prompt_ids, s.prompt_ids), len(s.prompt_ids) - 1)
            P = shared if shared >= min_prefix else 0
            top = max(longest, s.length)
            if P + (len(cur) + 1) * (top - P) <= token_budget:
                cur.append(s)
                lcp, longest = shared, top
                continue
            out.append(cur)
        cur, lcp, longest = [s], len(s.prompt_ids) - 1, s.length
    if cur:
        out.append(cur)
    return out
