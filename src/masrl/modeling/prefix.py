"""Shared-prompt-prefix grouping, pure functions.

Every call of an agent starts with the same system prompt and worked examples; only the
question differs. Grouping rows by their longest common token prefix lets the engine and the
trainer compute that prefix once per group instead of once per row.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def group_by_prefix(
    seqs: list[list[int]], *, keys: Sequence[Hashable] | None = None, min_prefix: int = 16, max_group: int | None = None
) -> list[tuple[list[int], int]]:
    """Partition row indices into groups that share a prefix of at least ``min_prefix`` tokens.

    Returns ``[(rows, prefix_len), ...]``. Rows with the same key (e.g. LoRA adapter) only
    group together. The prefix always leaves at least one token of each row outside it (the
    last prompt token must be run to get the first logits). Singletons get prefix length 0.
    """
    if not seqs:
        return []
    keys = list(keys) if keys is not None else [None] * len(seqs)
    order = sorted(range(len(seqs)), key=lambda i: (str(keys[i]), seqs[i]))
    groups: list[tuple[list[int], int]] = []
    rows = [order[0]]
    lcp = len(seqs[order[0]]) - 1
    for i in order[1:]:
        shared = min(lcp, common_prefix_len(seqs[rows[-1]], seqs[i]), len(seqs[i]) - 1)
        full = max_group is not None and len(rows) >= max_group
        if keys[i] == keys[rows[0]] and shared >= min_prefix and not full:
            rows.append(i)
            lcp = shared
        else:
            groups.append((rows, lcp if len(rows) > 1 else 0))
            rows, lcp = [i], len(seqs[i]) - 1
    groups.append((rows, lcp if len(rows) > 1 else 0))
    return groups


def slot_layout(prompts: list[list[int]], *, keys: Sequence[Hashable] | None = None, min_prefix: int = 16,
                share: bool = True) -> tuple[list[tuple[list[int], int]], list[int], int, int]:
    """An engine's KV-slot layout for a batch: ``[shared prefix | gap | left-padded rest of prompt]``.

    Returns ``(groups, pre, pmax, smax)``: the prefix groups (``group_by_prefix``; none when
    ``share`` is off), each row's prefix length, the longest prefix, the longest rest of a prompt.
    """
    groups = group_by_prefix(prompts, keys=keys, min_prefix=min_prefix) if share else []
    pre = [0] * len(prompts)
    for rows, plen in groups:
        for r in rows:
            pre[r] = plen
    return groups, pre, max(pre), max(len(p) - k for p, k in zip(prompts, pre))
