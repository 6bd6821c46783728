"""The rollout host's own work, the Python between the device's steps, measured on a CPU.

On a GPU the synchronous long-tail step (bench_async.py) keeps the device busy about half its time:
the rest is the host's work on the critical path between steps (docs/benchmarks.md). That work is
Python and the same on any machine, so it can be measured here, where the model's arithmetic is made
negligible: a skeleton model with Qwen2.5-0.5B's 24 layers, 14 query and 2 key/value heads, but
widths of 56 and a 512-token vocabulary. Three parts, each timed around the engine's own functions:

* prefill: one prefill step of a next turn (every row 128-304 tokens cached in the pool, 62 new), rows
  32 / 128 / 256: the host's milliseconds in ``PoolPrefill.rows`` outside the model's forwards
  (index arrays, copies to the device, the new keys and values written into the pool), and the ATen
  operations the whole step dispatches that do work on the device (no views): on a GPU each is a kernel
  launch or a copy, and their count does not depend on the machine.
* the same step with 16 new tokens a row (a next turn's new message), both ways: the lean forward's
  prefill as above, and token rows of the decode step (``ModelRunner._prefill_rows``, the path where CUDA
  graphs run): host ms and operations outside the graph replays, each replay stood in for by a ready
  tensor of final hidden states (the output head on each call's last row is counted).
* chunk: the paged engine's bookkeeping per decode chunk of 8 steps at 256 rows (schedule, the rows'
  buffers, sampling settings, random numbers, keeping the tokens: the functions' time over the run,
  a prefill's share included, over the chunks), outside the decode steps and the sampler.
* prepare: ``PromptRenderer.prepare`` per call, for 256 conversations at turns 1-4 (chat template,
  the check that a turn continues the last one, tokenising), as the long-tail workload sends them
  (each assistant message the last 200 characters of its completion).

    python benchmarks/bench_host.py [--repeat 5]

Run it at two commits to compare; each figure is the median over ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import platform
import random
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from masrl import models
from masrl.engines.paged import PagedEngine
from masrl.engines.paged import prefill as paged_prefill
from masrl.engines.paged import scheduler as scheduler_mod
from masrl.engines.paged.runner import ModelRunner
from masrl.messages import GenCall, GenRequest, SamplingParams
from masrl.worker.sampler.prompts import PromptRenderer


class Timers:
    """Seconds spent inside wrapped functions (inclusive), by name."""

    def __init__(self):
        self.s: collections.Counter = collections.Counter()
        self.n: collections.Counter = collections.Counter()
        self._undo: list = []

    def wrap(self, owner, attr: str, name: str | None = None) -> None:
        name = name or attr
        f = getattr(owner, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                self.s[name] += time.perf_counter() - t
                self.n[name] += 1

        setattr(owner, attr, timed)
        self._undo.append((owner, attr, f))

    def undo(self) -> None:
        for owner, attr, f in reversed(self._undo):
            setattr(owner, attr, f)
        self._undo.clear()


def skeleton():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=56, intermediate_size=64, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
                      use_sliding_window=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    return Qwen2ForCausalLM(cfg).eval(), models.load_tokenizer(models.TINY_RANDOM)


def sp(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=1.0, ignore_eos=True)


class OpCount(TorchDispatchMode):
    """The ATen operations dispatched inside it that do work on their device (view-like ones and casts to the
    same dtype left out): on a GPU each is a kernel launch or a copy, paid on the host."""

    VIEWS = {"view", "transpose", "permute", "reshape", "chunk", "unsqueeze", "t", "expand", "slice", "select",
             "lift_fresh", "alias", "detach", "_unsafe_view", "split", "unbind", "squeeze", "as_strided"}

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.n += name not in self.VIEWS and not (name == "to" and args and out is args[0])
        return out


def next_turn(model, tok, rows: int, new: int, **engine_kw) -> tuple[PagedEngine, list[list[int]]]:
    """An engine whose prefix cache holds ``rows`` first turns (128-304 tokens each), and their next turns'
    prompts (each first turn, its sampled token and ``new`` more)."""
    rng = random.Random(rows)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=16384, **engine_kw)
    first = [[rng.randrange(3, 512) for _ in range(rng.randrange(128, 305))] for _ in range(rows)]
    outs = eng.generate([GenRequest(p, sp(1), seed=i) for i, p in enumerate(first)])  # fills the prefix cache
    return eng, [p + o.completion_ids + [rng.randrange(3, 512) for _ in range(new)] for p, o in zip(first, outs)]


@contextlib.contextmanager
def counting(owner, attr: str, ops: OpCount | None):
    """With ``ops``: every call of ``owner.attr`` runs under it (its operations counted); else nothing."""
    run = getattr(owner, attr)
    if ops is not None:
        def counted(self, *a):
            with ops:
                return run(self, *a)

        setattr(owner, attr, counted)
    try:
        yield
    finally:
        setattr(owner, attr, run)


def prefill_ms(model, tok, rows: int, count: bool = False, new: int = 61) -> tuple[float, int, int]:
    """One next-turn prefill step of ``rows`` rows: the host's milliseconds in it outside the model's
    forwards, the forwards it took (the engine's prefill budget splits a wide batch) and, with ``count``
    (timed apart: counting slows the step), the operations ``OpCount`` counts over the whole step."""
    eng, nxt = next_turn(model, tok, rows, new)
    t = Timers()
    t.wrap(paged_prefill.PoolPrefill, "rows")
    t.wrap(eng.runner.fwd, "hidden")
    ops = OpCount()
    try:
        with counting(paged_prefill.PoolPrefill, "run", ops if count else None):
            eng.generate([GenRequest(p, sp(1), seed=i) for i, p in enumerate(nxt)])
    finally:
        t.undo()
    return 1e3 * (t.s["rows"] - t.s["hidden"]), t.n["hidden"], ops.n


def rows_prefill_ms(model, tok, rows: int, count: bool = False, new: int = 15) -> tuple[float, int, int]:
    """The same next-turn step (``new`` + 1 new tokens a row) as token rows of the decode step
    (``ModelRunner._prefill_rows``, as on a GPU with CUDA graphs): the host's milliseconds outside the
    replays, the replays, and the operations dispatched outside them. Each replay is stood in for by a
    ready tensor of final hidden states (on a GPU it is one graph launch), so the keys and values are not
    computed: host work only."""
    eng, nxt = next_turn(model, tok, rows, new, graph_prefill=True)
    ready = torch.zeros((eng.runner.rows_batch, model.config.hidden_size))  # final hidden states
    replays = [0]
    eng.runner.decode = lambda B, S, count=True: replays.__setitem__(0, replays[0] + 1) or ready[:B]
    t = Timers()
    t.wrap(ModelRunner, "_prefill_rows")
    ops = OpCount()
    try:
        with counting(ModelRunner, "_prefill_rows", ops if count else None):
            eng.generate([GenRequest(p, sp(1), seed=i) for i, p in enumerate(nxt)])
    finally:
        t.undo()
    return 1e3 * t.s["_prefill_rows"], replays[0], ops.n


def chunk_ms(model, tok, rows: int = 256) -> float:
    """Host milliseconds of the engine's bookkeeping per decode chunk of ``rows`` rows."""
    rng = random.Random(7)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=16384)
    prompts = [[rng.randrange(3, 512) for _ in range(rng.randrange(40, 200))] for _ in range(rows)]
    t = Timers()
    parts = ("_load", "sampling", "_uniforms", "_take", "_ensure")
    for name in ("_decode_chunk", "_uniforms", "_take"):
        t.wrap(PagedEngine, name)
    for name in ("_load", "sampling", "_ensure"):
        t.wrap(ModelRunner, name)
    t.wrap(scheduler_mod.Scheduler, "schedule")
    try:
        eng.generate([GenRequest(p, sp(65), seed=i) for i, p in enumerate(prompts)])
    finally:
        t.undo()
    return 1e3 * sum(t.s[n] for n in (*parts, "schedule")) / t.n["_decode_chunk"]


def prepare_us(tok, turns: int = 4, n: int = 256) -> list[float]:
    """Microseconds of ``PromptRenderer.prepare`` per call at turns 1..``turns`` (turn 0 is a fresh prompt)."""
    rng = random.Random(3)
    r = PromptRenderer(tok)
    convs = [[{"role": "user", "content": f"What is {rng.randrange(100)} + {rng.randrange(100)}?"}] for _ in range(n)]
    prev: list[str | None] = [None] * n
    out = []
    for turn in range(turns + 1):
        calls = [GenCall(f"c{turn}-{i}", "p", list(convs[i]), sp(64), extends=prev[i]) for i in range(n)]
        t0 = time.perf_counter()
        ps = r.prepare(calls, 8192)
        dt = time.perf_counter() - t0
        if turn:
            out.append(1e6 * dt / n)
        for i, c in enumerate(calls):
            comp = [rng.randrange(100, 49000) for _ in range(64)]
            r.remember(c.call_id, ps[i], comp)
            text = tok.decode(comp, skip_special_tokens=True)
            convs[i] += [{"role": "assistant", "content": text[-200:]}, {"role": "user", "content": "Go on."}]
            prev[i] = c.call_id
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)  # the host's own thread, as on a GPU host
    model, tok = skeleton()
    med = statistics.median
    rows = []
    for b in (32, 128, 256):
        got = [prefill_ms(model, tok, b) for _ in range(a.repeat)]
        rows.append((f"prefill step, {b} rows in {got[0][1]} forwards (ms outside them)", med(g[0] for g in got)))
        rows.append((f"prefill step, {b} rows: operations dispatched (not views)", prefill_ms(model, tok, b, count=True)[2]))
    for b in (32, 128, 256):  # a next turn of 16 new tokens a row: the lean forward's prefill, then token rows
        got = [prefill_ms(model, tok, b, new=15) for _ in range(a.repeat)]
        rows.append((f"+16 tokens a row, {b} rows, lean forward: {got[0][1]} forwards (ms outside them)", med(g[0] for g in got)))
        rows.append((f"+16 tokens a row, {b} rows, lean forward: operations dispatched", prefill_ms(model, tok, b, True, 15)[2]))
        got = [rows_prefill_ms(model, tok, b) for _ in range(a.repeat)]
        rows.append((f"+16 tokens a row, {b} rows, token rows: {got[0][1]} replays (ms outside them)", med(g[0] for g in got)))
        rows.append((f"+16 tokens a row, {b} rows, token rows: operations dispatched outside the replays",
                     rows_prefill_ms(model, tok, b, True)[2]))
    rows.append(("decode chunk bookkeeping, 256 rows (ms a chunk)", med(chunk_ms(model, tok) for _ in range(a.repeat))))
    prep = [prepare_us(tok) for _ in range(a.repeat)]
    for k in range(len(prep[0])):
        rows.append((f"prepare, turn {k + 1} (us a call)", med(p[k] for p in prep)))
    print(f"command: python {' '.join(sys.argv)}")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"Python {platform.python_version()}; torch threads 1; median of {a.repeat}")
    print("\n| host work | figure |\n| --- | --- |")
    for name, v in rows:
        print(f"| {name} | {v:,} |" if isinstance(v, int) else f"| {name} | {v:.2f} |")


if __name__ == "__main__":
    main()
