"""Launch settings of the paged decode step's parts, measured one at a time on a GPU (issue 28's decode bar).

* ``attention``: ``paged_kernels.paged_attention`` over a grid of launch settings (16-bit MMAs or tf32, keys per
  block, warps, pipeline stages) from batch 256 x ~192 keys a row to batch 16 x ~8,192, each checked
  against ``paged_attention_ref``; "shipped" is what ``paged_kernels.paged_launch`` picks for the case's length
  class, the fastest settings per length tell ``PAGED_LAUNCH`` and ``PAGED_LONG_KEYS`` what to be.
* ``fused``: ``paged_kernels.paged_rope_attention`` (rope, the pool write and attention in one launch; the paged
  engine's ``fused_rope``, for the short length class) against the two kernels it replaces.
* ``split``: split attention (``paged_attention(..., splits=n)``) for few long rows, 1 to 128 runs a row, from
  batch 64 x ~1,024 keys to batch 1 x ~16,000; "shipped" is ``paged_kernels.paged_splits``'s choice.
* ``gemm``: the decode step's matmuls at the 0.5B shape (Qwen2.5-0.5B: hidden 896, 14 query and 2 key/value
  heads, MLP 4,864, vocabulary 151,936) as the step calls them, by cuBLAS and by cuBLASLt, and with the weight
  transposed once (``x @ w_t``, "NN"), at batch 1, 64 and 256, the weights from memory.

Each time is the median over 15 replays of a CUDA graph holding 20 launches, divided by 20 (the launch
cost a graph removes, as in the engine). Random bf16 data.

    source scripts/gpu/setup.sh && python3 benchmarks/kernel_sweep.py [--only attention,fused,gemm,split]
"""

from __future__ import annotations

import argparse
import itertools

import harness
import torch
import torch.nn.functional as F

DEV = "cuda"
H, HKV, D, HIDDEN, INTER, VOCAB = 14, 2, 64, 896, 4864, 151936


def graph_us(fn, n: int = 20) -> float:
    """Microseconds per call of ``fn`` replayed ``n`` times inside one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    return harness.replay_ms(g.replay, n=15) * 1000.0 / n


def attention_case(batch: int, mean_len: int, bs: int = 16, seed: int = 0):
    from masrl.engines.paged.kernels import paged as K

    gen = torch.Generator(device=DEV).manual_seed(seed)
    lens = torch.randint(mean_len - 32, mean_len + 33, (batch,), generator=gen, device=DEV).to(torch.int32)
    per_row = (int(lens.max()) + bs - 1) // bs
    blocks = batch * per_row + 1
    kf = torch.randn(blocks * bs, HKV, D, generator=gen, device=DEV).to(torch.bfloat16)
    vf = torch.randn(blocks * bs, HKV, D, generator=gen, device=DEV).to(torch.bfloat16)
    tables = (torch.randperm(blocks - 1, generator=gen, device=DEV)[: batch * per_row] + 1).view(batch, per_row)
    tables = tables.to(torch.int32).contiguous()
    q = torch.randn(batch, HKV, H // HKV, D, generator=gen, device=DEV).to(torch.bfloat16)
    ref = K.paged_attention_ref(q.float(), kf.float(), vf.float(), tables, lens, per_row * bs, bs, D**-0.5)
    return (q, kf, vf, tables, lens, per_row * bs, bs, D**-0.5), ref


def attention(rows: list) -> None:
    from masrl.engines.paged.kernels import paged as K

    grid = list(itertools.product((False, True), (16, 32, 64, 128), (2, 4, 8), (1, 2, 3, 4)))
    for batch, mean_len in ((256, 192), (128, 512), (64, 1024), (64, 2048), (16, 8192)):
        args, ref = attention_case(batch, mean_len)
        ship = K.paged_launch(torch.bfloat16, K.paged_length_class(int(args[4].max())))
        kv_bytes = 2 * int(args[4].sum()) * HKV * D * 2
        results = []
        for lowp, block, warps, stages in grid:
            launch = {"LOWP": lowp, "BLOCK": block, "num_warps": warps, "num_stages": stages}
            try:
                err = (K.paged_attention(*args, launch=launch).float() - ref).abs().max().item()
                us = graph_us(lambda launch=launch, args=args: K.paged_attention(*args, launch=launch))
            except Exception as exc:  # noqa: BLE001 - a setting the compiler rejects: report, go on
                print(f"  {launch}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            results.append((us, err, launch))
        shipped = next(r for r in results if r[2] == ship)
        before = next(r for r in results if r[2] == {"LOWP": False, "BLOCK": 64, "num_warps": 4, "num_stages": 3})
        print(f"\n== paged attention, batch {batch}, ~{mean_len} keys a row ({kv_bytes / 2**20:.1f} MiB of K and V; "
              f"{kv_bytes / 4.8e12 * 1e6:.1f} us at 4.8 TB/s)")
        print("| setting | us | vs shipped | max abs err vs fp32 |\n| --- | --- | --- | --- |")
        for us, err, launch in sorted(results, key=lambda r: r[0])[:12] + [shipped, before]:
            print(f"| {launch} | {us:.2f} | {shipped[0] / us:.2f}x | {err:.2e} |")
        rows.append((f"paged attention b{batch} L~{mean_len}", shipped[0], min(r[0] for r in results if r[1] < 2e-2)))
        rows.append(("  the earlier setting (tf32, 64 keys, 4 warps, 3 stages)", before[0], before[0]))


def fused_case(batch: int, mean_len: int):
    """The two-kernel step and the one-kernel step of ``attention_case``'s rows, as two callables."""
    from masrl.engines.paged.kernels import paged as K

    (_, kf, vf, tables, lens, _, bs, scale), _ = attention_case(batch, mean_len)
    gen = torch.Generator(device=DEV).manual_seed(1)
    qkv = torch.randn(batch, (H + 2 * HKV) * D, generator=gen, device=DEV).to(kf.dtype)
    ang = torch.randn(batch, D // 2, generator=gen, device=DEV)
    cos, sin = torch.cat([ang, ang], -1).cos().to(kf.dtype), torch.cat([ang, ang], -1).sin().to(kf.dtype)
    pos = lens.long() - 1
    slots = tables.gather(1, (pos // bs)[:, None]).squeeze(1).long() * bs + pos % bs
    cls = K.paged_length_class(int(lens.max()))

    def two():
        qr = K.rope_and_cache_paged(qkv, cos, sin, kf, vf, slots, H, HKV, D)
        return K.paged_attention(qr, kf, vf, tables, lens, cls, bs, scale).reshape(batch, H * D)

    def one():
        return K.paged_rope_attention(qkv, cos, sin, kf, vf, slots, tables, lens, H, HKV, D, cls, bs, scale)

    return two, one


def fused(rows: list) -> None:
    """``paged_kernels.paged_rope_attention`` (one launch) against ``rope_and_cache_paged`` + ``paged_attention``."""
    print("\n== rope + paged attention: two kernels against one\n| case | two kernels us | one kernel us | one / two |"
          " max abs err |\n| --- | --- | --- | --- | --- |")
    for batch, mean_len in ((256, 192), (64, 2048)):
        two, one = fused_case(batch, mean_len)
        err = (two().float() - one().float()).abs().max().item()
        t2, t1 = graph_us(two), graph_us(one)
        print(f"| batch {batch}, ~{mean_len} keys | {t2:.2f} | {t1:.2f} | {t1 / t2:.2f}x | {err:.2e} |")
        rows.append((f"rope + attention b{batch} L~{mean_len}", t2, t1))


def gemm(rows: list) -> None:
    """Each decode matmul as the step calls it (``F.linear``; ``addmm_`` into the residual for o and down), the
    weight from memory (copies, used in turn, of more bytes than two L2s), by cuBLAS and by cuBLASLt, and with
    the weight transposed once (``x @ w_t``, "NN")."""
    gen = torch.Generator(device=DEV).manual_seed(0)
    shapes = {"qkv (bias)": (HIDDEN, (H + 2 * HKV) * D), "o (+h)": (HIDDEN, HIDDEN), "gate_up": (HIDDEN, 2 * INTER),
              "down (+h)": (INTER, HIDDEN), "lm_head": (HIDDEN, VOCAB)}
    print("\n== decode matmuls, 0.5B shape, bf16, weights from memory\n"
          "| matmul | batch | cuBLAS (TN) us | TFLOP/s | cuBLASLt us | Lt / cuBLAS | x @ w_t (NN) us | NN / TN |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, (k, n) in shapes.items():
        copies = max(1, -(-240 * 2**20 // (n * k * 2)))
        ws = [(torch.randn(n, k, generator=gen, device=DEV) * 0.02).to(torch.bfloat16) for _ in range(copies)]
        wts = [w.t().contiguous() for w in ws]
        bias = torch.zeros(n, device=DEV, dtype=torch.bfloat16) if "bias" in name else None
        for m in (1, 64, 256):
            x = torch.randn(m, k, generator=gen, device=DEV).to(torch.bfloat16)
            h = torch.zeros(m, n, device=DEV, dtype=torch.bfloat16)
            turn = itertools.cycle(range(copies))

            def tn(x=x, h=h, ws=ws, turn=turn, bias=bias, res="+h" in name):
                w = ws[next(turn)]
                if not res:
                    return F.linear(x, w, bias)
                return h.add_(F.linear(x, w, bias)) if bias is not None else h.addmm_(x, w.t())

            def nn(x=x, h=h, wts=wts, turn=turn, bias=bias, res="+h" in name):
                wt = wts[next(turn)]
                if res:
                    return h.addmm_(x, wt)
                return torch.addmm(bias, x, wt) if bias is not None else x @ wt

            t_blas = graph_us(tn)
            torch.backends.cuda.preferred_blas_library("cublaslt")
            try:
                t_lt = graph_us(tn)
            finally:
                torch.backends.cuda.preferred_blas_library("cublas")
            t_nn = graph_us(nn)
            print(f"| {name} | {m} | {t_blas:.2f} | {2 * m * k * n / t_blas / 1e6:.0f} | {t_lt:.2f} | "
                  f"{t_blas / t_lt:.2f}x | {t_nn:.2f} | {t_blas / t_nn:.2f}x |")
            if m == 256:
                rows.append((f"{name} b256 (cuBLAS; best of Lt, NN)", t_blas, min(t_blas, t_lt, t_nn)))


def split(rows: list) -> None:
    """Split attention for few long rows (``paged_attention(..., splits=n)``: runs of each row's keys, one
    program each, and a kernel that adds them up) against one program a (row, KV head), long-class settings."""
    from masrl.engines.paged.kernels import paged as K

    print("\n== paged attention, long rows: keys split into runs\n"
          "| case | MiB of K and V | runs a row | us | GB/s | vs one program a row | max abs err vs fp32 | shipped |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch, mean_len in ((64, 1024), (64, 2048), (16, 8192), (4, 16000), (1, 16000)):
        args, ref = attention_case(batch, mean_len)
        kv_bytes = 2 * int(args[4].sum()) * HKV * D * 2
        ship = K.paged_splits(batch, HKV, K.PAGED_LONG_KEYS)
        one = None
        for ns in (1, 2, 4, 8, 16, 32, 64, 128):
            a = list(args)
            a[5] = K.PAGED_LONG_KEYS  # the long length class's launch settings
            err = (K.paged_attention(*a, splits=ns).float() - ref).abs().max().item()
            us = graph_us(lambda a=a, ns=ns: K.paged_attention(*a, splits=ns))
            one = one or us
            print(f"| batch {batch}, ~{mean_len} keys | {kv_bytes / 2**20:.1f} | {ns} | {us:.2f} | "
                  f"{kv_bytes / us / 1e3:.0f} | {one / us:.2f}x | {err:.2e} | {'yes' if ns == ship else ''} |")
            if ns == ship:
                rows.append((f"paged attention b{batch} L~{mean_len}: {ns} runs a row (before: 1)", one, us))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="attention,fused,gemm,split")
    only = set(ap.parse_args().only.split(","))
    print(harness.header(), flush=True)
    rows: list = []
    if "attention" in only:
        attention(rows)
    if "fused" in only:
        fused(rows)
    if "gemm" in only:
        gemm(rows)
    if "split" in only:
        split(rows)
    print("\n| part | as shipped us | best us | best / shipped |\n| --- | --- | --- | --- |")
    for name, now, best in rows:
        print(f"| {name} | {now:.2f} | {best:.2f} | {best / now:.2f}x |")


if __name__ == "__main__":
    main()
