"""Token logprobs for callers that ask for them (a gateway request's ``logprobs``/``top_logprobs``).

The sampled tokens' logprobs are the engine's own record (softmax(logits / T), the numbers the
trainer uses). The k likeliest tokens at each position are not kept by any engine, so they come
from one forward pass over the prompt and completion, at the same temperature, with the call's
adapter on: only for calls that ask.
"""

from __future__ import annotations

import contextlib

import torch


@torch.no_grad()
def token_logprobs(tokenizer, output, k: int, *, model, prompt: list[int], temperature: float, adapter: str | None,
                   lora: bool) -> list[dict]:
    """Per sampled token ``{"token", "logprob", "bytes", "top_logprobs"}``; ``top_logprobs`` holds the
    ``k`` likeliest tokens (empty when k is 0)."""

    def piece(token_id: int, logprob: float) -> dict:
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8", "replace"))}

    out = [{**piece(t, lp), "top_logprobs": []} for t, lp in zip(output.completion_ids, output.logprobs)]
    if not k or not output.completion_ids:
        return out
    ids = torch.tensor([prompt + list(output.completion_ids)], device=next(model.parameters()).device)
    with _only_adapter(model, adapter, lora):
        logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()
    top = torch.log_softmax(logits / max(temperature, 1e-5), dim=-1).topk(k, dim=-1)
    for row, values, indices in zip(out, top.values.tolist(), top.indices.tolist()):
        row["top_logprobs"] = [piece(i, v) for v, i in zip(values, indices)]
    return out


@contextlib.contextmanager
def _only_adapter(model, adapter: str | None, lora: bool):
    """A forward through ``model`` with LoRA ``adapter`` on (None: the plain base, adapters off);
    a model without adapters (``lora`` false) runs as it is."""
    if not lora:
        yield
        return
    if adapter is None:
        with model.disable_adapter():
            yield
        return
    prev = model.active_adapter
    grads = {id(p): p.requires_grad for p in model.parameters()}
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(prev)
        for p in model.parameters():  # set_adapter flips requires_grad: put back what it was
            p.requires_grad_(grads[id(p)])
