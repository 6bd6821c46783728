"""The decode step's sampler: torch's ``sample_tokens`` against the fused Triton sampler, one GPU.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_sampling.py

Random bf16 logits (``randn * 4``) of SmolLM2's vocabulary (49,152) and Qwen2.5's (151,936) at 1, 64 and
256 rows, every row sampled at T = 1 with its own uniform number, and every row greedy (evaluation).
Each time is the median of 50 calls timed by CUDA events, launched eagerly as the engines launch them.
Both sides draw with the same numbers; "same token" counts the rows where they agree, "exact draw" checks
the fused tokens against the float64 inverse-CDF draw (``sample_kernel.agrees``).
"""

from __future__ import annotations

import harness
import torch

from masrl.engines.paged.kernels import sample as sample_kernel  # noqa: E402
from masrl.engines.sampling import BatchFlags, sample_tokens  # noqa: E402


def case(rows: int, vocab: int, greedy: bool, gen: torch.Generator) -> tuple:
    logits = (torch.randn(rows, vocab, generator=gen, device="cuda") * 4).to(torch.bfloat16)
    temps = torch.full((rows,), 0.0 if greedy else 1.0, device="cuda")
    top_ps = torch.ones(rows, device="cuda")
    flags = BatchFlags.of(temps.tolist(), top_ps.tolist())
    u = torch.rand(rows, generator=gen, device="cuda")

    def torch_side():
        return sample_tokens(logits, temps, top_ps, None, flags, u)

    def fused_side():
        return sample_kernel.sample(logits, temps, u)

    t_ref, _ = torch_side()
    t_new, lp_new = fused_side()
    same = float((t_ref == t_new).float().mean())
    exact = sample_kernel.agrees(logits.float(), temps, u, t_new, lp_new)
    ms_t = harness.replay_ms(torch_side, n=50)
    ms_f = harness.replay_ms(fused_side, n=50)
    return ms_t, ms_f, same, exact


def main() -> None:
    print(harness.header(), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    print("| vocabulary | rows | rows' mode | torch us | fused us | torch / fused | same token | exact draw |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for vocab in (49152, 151936):
        for rows in (1, 64, 256):
            for greedy in (False, True):
                ms_t, ms_f, same, exact = case(rows, vocab, greedy, gen)
                print(f"| {vocab:,} | {rows} | {'greedy' if greedy else 'T=1'} | {ms_t * 1000:.1f} | {ms_f * 1000:.1f} | "
                      f"{ms_t / ms_f:.2f}x | {same:.3f} | {exact} |", flush=True)


if __name__ == "__main__":
    main()
