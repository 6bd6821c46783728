"""Message helpers every workflow's prompts use: worked examples as chat turns, numbered lists."""

from __future__ import annotations


def few_shot(system: str, examples: list[tuple[str, str]], user: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system}]
    for q, a in examples:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": user})
    return msgs


def numbered(items: list[str]) -> str:
    return " ".join(f"{i}. {s}" for i, s in enumerate(items, 1)) or "none"
