"""What one decoder layer keeps for backward in a LoRA update, per token: the trainer's forward against PEFT's.

    python3 benchmarks/saved_activations.py [--shape 7b] [--tokens 256] [--rank 16] [--device cpu]

One layer of the shape's config (random bf16 weights; only the layer is built, so the 7B shape fits a laptop), a
LoRA adapter of the given rank on every projection in fp32 (as the trainer holds adapters), one forward with
autograd over ``--tokens`` tokens. Every tensor autograd keeps for backward is counted once by its storage,
leaving out the parameters (the model holds those anyway) and the adapters' own bf16 casts (a few MB a layer, not
per token). Sides: the lean forward as it ships (``lean.lora_linear``: the adapter cast to bf16) and the same
forward through PEFT's module forward (the input cast to the adapter's fp32, and that copy kept). On a CPU the
norms and SwiGLU run torch's own ops; on CUDA the fused ones, which keep less.
"""

from __future__ import annotations

import argparse
from collections import Counter

import harness
import torch


def layer_model(shape: str, rank: int, device: str):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from masrl.models import RANDOM_SHAPES

    cfg = RANDOM_SHAPES[harness.SHAPES[shape]](1024)
    cfg.num_hidden_layers = 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(device=device, dtype=torch.bfloat16).requires_grad_(False)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    pm = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, task_type="CAUSAL_LM"))
    for n, p in pm.named_parameters():
        if "lora_" in n:
            p.data = p.data.float()
    return pm


def kept_per_token(pm, tokens: int, peft_forward: bool) -> tuple[float, Counter]:
    """KB a token that autograd keeps, in all and by (width, dtype)."""
    from masrl.modeling.lean import LlamaForward

    fwd = LlamaForward(pm)
    if peft_forward:
        fwd._proj = lambda mod, x, adapters: mod(x)
    dev = pm.base_model.model.model.embed_tokens.weight.device
    ids = torch.randint(0, 1024, (1, tokens), device=dev)
    params = {p.untyped_storage().data_ptr() for p in pm.parameters()}
    kept: dict[int, torch.Tensor] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in params and t.dim() >= 2 and t.shape[0] in (1, tokens):  # activations, not the adapters' casts
            kept.setdefault(key, t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fwd.hidden(ids, torch.arange(tokens, device=dev)[None], None)
    by = Counter()
    for t in kept.values():
        by[(t.shape[-1], str(t.dtype).replace("torch.", ""))] += t.untyped_storage().nbytes() / tokens / 1024
    return sum(by.values()), by


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="7b", choices=sorted(harness.SHAPES))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    pm = layer_model(a.shape, a.rank, a.device)
    ours, ours_by = kept_per_token(pm, a.tokens, peft_forward=False)
    theirs, theirs_by = kept_per_token(pm, a.tokens, peft_forward=True)
    print(harness.header())
    print(f"shape {a.shape} ({harness.SHAPES[a.shape]}), one layer, LoRA r{a.rank} on every projection (fp32), "
          f"bf16 base, {a.tokens} tokens, {a.device}\n")
    print("| kept for backward, KB a token and layer | lean forward (masrl) | PEFT's forward | ratio |")
    print("| --- | --- | --- | --- |")
    for key in sorted(set(ours_by) | set(theirs_by), key=lambda k: -theirs_by.get(k, 0)):
        print(f"| width {key[0]}, {key[1]} | {ours_by.get(key, 0):.1f} | {theirs_by.get(key, 0):.1f} | |")
    print(f"| all | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
