"""The update of a games step: many calls with long, nearly shared prompts and 3-token answers.

    source scripts/gpu/setup.sh && python3 benchmarks/bench_games_update.py [--games 64] [--budgets 2048,8192]

A TicTacToe self-play step (games.sh: 8 seeds x 8 samples) serves ~300-480 calls, each a ~670-token prompt (the
rules, the board, the moves so far) and a 3-token reply such as ``[4]``. The prompts come from TextArena itself:
random legal games, eight per seed, each move's prompt built by the games workflow and tokenized with SmolLM2's
tokenizer (``--tokenizer``). The model is the 135M shape with random weights. Each side runs one optimizer step on
the same calls from the same weights: the shared-prefix layout at several ``micro_batch_tokens`` budgets, and the
packed layout; it prints micro-batches, tokens run, seconds, peak GPU memory, and (``--profile``) the share of the
wall time the GPU was busy, which tells a launch-bound update (many small micro-batches) from a compute-bound one.
On a CPU: ``MASRL_BENCH_MODEL=tiny-random MASRL_BENCH_DEVICE=cpu python3 benchmarks/bench_games_update.py --games 8
--budgets 2048``.
"""

from __future__ import annotations

import argparse
import platform
import random
import time

import harness


def game_prompts(games: int, tokenizer: str) -> list[tuple[int, list[int]]]:
    """(game seed, prompt ids) of every move of ``games`` random legal TicTacToe games, eight per seed."""
    from masrl.families.games import arena
    from masrl.families.games.workflow import TextArenaGame
    from masrl.models import load_tokenizer

    tok = load_tokenizer(tokenizer)
    wf = TextArenaGame("TicTacToe-v0-train", ["player_0", "player_1"])
    out = []
    for g in range(games):
        game = arena.Game("TicTacToe-v0-train", 2, g // 8).start()
        rng = random.Random(g)
        while not game.done:
            pid, obs = game.observe()
            text = tok.apply_chat_template(wf._messages(pid, obs), add_generation_prompt=True, tokenize=False)
            out.append((g // 8, list(tok.encode(text, add_special_tokens=False))))
            game.move(pid, arena.random_move(game, obs, rng))
    return out


def run(host, prompts, algo, start, vocab: int, profile: bool = False):
    import torch

    from masrl.worker.model.precision import MasterWeightsAdamW
    from masrl.worker.updater.batching import Sample
    from masrl.worker.updater.training import Learner

    with torch.no_grad():
        for p, s in zip(host.policy_parameters("p"), start):
            p.copy_(s)
    opt = MasterWeightsAdamW(host.policy_parameters("p"), lr=1e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    rng = random.Random(0)
    samples = [Sample(f"s{i}", "p", p, [rng.randrange(3, vocab) for _ in range(3)], [-1.0] * 3, 0.7,
                      {"task_id": t}, reward=float(i % 3)) for i, (t, p) in enumerate(prompts)]
    cuda = host.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    busy = float("nan")
    t0 = time.perf_counter()
    if profile and cuda:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof_ctx

        with prof_ctx(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            Learner(host, algo, 0).train("p", samples, opt, 1.0)
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        busy = sum(e.device_time for e in evs) / 1e6 / wall
    else:
        Learner(host, algo, 0).train("p", samples, opt, 1.0)
    if cuda:
        torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
    return secs, peak, busy


def main() -> None:
    import torch

    from masrl.config import AlgorithmConfig, OptimConfig
    from masrl.policies import PolicySpec
    from masrl.worker.model.held import HeldModel
    from masrl.worker.updater.batching import Sample, micro_batches, prefix_cost
    from masrl.worker.updater.training import Learner

    ap = argparse.ArgumentParser()
    ap.add_argument("--games", type=int, default=64)
    ap.add_argument("--budgets", default="2048,4096,8192,16384")
    ap.add_argument("--tokenizer", default="smollm2-135m-instruct")
    ap.add_argument("--profile", action="store_true", help="also a profiled run of each side: GPU-busy share of wall")
    args = ap.parse_args()
    cuda = harness.DEV.startswith("cuda")
    name = harness.SHAPES["135m"]
    host = HeldModel(name, [PolicySpec("p", name, optim=OptimConfig(lr=1e-5))], device=harness.DEV,
                     dtype=torch.bfloat16 if cuda else torch.float32)
    vocab = host.core.config.vocab_size
    prompts = [(t, [i % vocab for i in p]) for t, p in game_prompts(args.games, args.tokenizer)]
    start = [p.detach().clone() for p in host.policy_parameters("p")]
    budgets = [int(b) for b in args.budgets.split(",")]
    sides = {f"prefix, {b} tokens": AlgorithmConfig(group_key=["task_id"], share_prefix=True, micro_batch_tokens=b)
             for b in budgets}
    sides[f"packed, {max(budgets)} tokens"] = AlgorithmConfig(group_key=["task_id"], share_prefix=False,
                                                              micro_batch_tokens=max(budgets))
    run(host, prompts[:16], sides[f"prefix, {budgets[0]} tokens"], start, vocab)  # warm-up
    dev = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    n_tok = sum(len(p) + 3 for _, p in prompts)
    print(f"`python3 benchmarks/bench_games_update.py --games {args.games} --budgets {args.budgets}` on {dev}, "
          f"torch {torch.__version__}: {len(prompts)} calls of {args.games} TicTacToe games "
          f"(prompts {n_tok / len(prompts):.0f} tokens on average, replies 3), {name}")
    print("| side | micro-batches | tokens run | update s | peak GiB | GPU busy | speed-up |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = None
    stand_in = [Sample(str(i), "p", p, [0, 0, 0], [0.0] * 3, 1.0, {}) for i, (_, p) in enumerate(prompts)]
    for algo in sides.values():
        layout = Learner(host, algo).layout()  # packed needs CUDA's varlen flash attention; else padded
        mbs = micro_batches(stand_in, algo.micro_batch_size, layout=layout, token_budget=algo.micro_batch_tokens)
        ran = {"prefix": sum(prefix_cost(m) for m in mbs), "packed": n_tok}.get(
            layout, sum(len(m) * max(s.length for s in m) for m in mbs))
        label = f"{layout}, {algo.micro_batch_tokens} tokens"
        secs, peak, _ = run(host, prompts, algo, start, vocab)
        busy = run(host, prompts, algo, start, vocab, profile=True)[2] if args.profile else float("nan")
        base = base or secs
        print(f"| {label} | {len(mbs)} | {ran} | {secs:.2f} | {peak:.2f} | {busy:.0%} | {base / secs:.2f}x |")


if __name__ == "__main__":
    main()
