"""The paged engine's parts on a CPU: the block pool and its prefix cache, the scheduler
(admission, sibling deferral, pre-emption), and the engine on a real tiny Llama against the eager
engine (greedy tokens, logprobs), under a budget that forces pre-emption, with calls joining a
running decode from another thread, and with one call too big for the budget beside good ones."""

import threading
import time

import numpy as np
import pytest
import torch
from helpers import full_logprobs

from masrl.config import SamplingParams
from masrl.engines.hf import HFEngine
from masrl.engines.paged import PagedEngine
from masrl.engines.paged.blocks import BlockPool, OutOfBlocks, block_hash
from masrl.engines.paged.calls import Sequence
from masrl.engines.paged.prefill import layout, token_rows
from masrl.engines.paged.scheduler import Scheduler
from masrl.errors import PromptError
from masrl.messages import GenRequest


def req(prompt, temperature=0.0, max_new_tokens=8, seed=None, stop=()):
    sp = SamplingParams(temperature=temperature, top_p=1.0, max_new_tokens=max_new_tokens, stop=tuple(stop))
    return GenRequest(list(prompt), sp, seed=seed)


# -- the block pool ------------------------------------------------------------------------------------

def test_pool_shares_cached_blocks_and_counts_references():
    pool = BlockPool(10, 4)
    prompt = list(range(13))  # 3 full blocks + 1 token
    hashes = pool.hashes(prompt, limit=len(prompt) - 1)
    assert len(hashes) == 3
    a, cached = pool.allocate(len(prompt), hashes)
    assert cached == 0 and len(a) == 4 and 0 not in a
    pool.register(a, hashes)
    b, cached = pool.allocate(len(prompt), hashes)
    assert cached == 12 and b[:3] == a[:3] and b[3] != a[3]
    assert [pool.ref[x] for x in a[:3]] == [2, 2, 2]
    assert pool.used() == 5
    pool.release(b)
    assert pool.used() == 4 and b == []
    pool.release(a)
    assert pool.used() == 0
    # freed blocks keep their hashes: a third prompt revives them, which costs free blocks again
    assert pool.cost(len(prompt), hashes) == 4
    c, cached = pool.allocate(len(prompt), hashes)
    assert cached == 12
    pool.release(c)
    # a different adapter (key) never shares
    other = pool.hashes(prompt, key="adapter-b", limit=12)
    assert not pool.cached_prefix(other)
    # a prompt that differs in its second block shares only the first
    changed = prompt[:5] + [99] + prompt[6:]
    assert len(pool.cached_prefix(pool.hashes(changed, limit=12))) == 1
    # forget (new weights): nothing is shared any more
    pool.forget()
    assert not pool.cached_prefix(hashes)


def test_pool_reuses_blocks_and_runs_dry():
    pool = BlockPool(4, 2)  # 3 usable blocks
    t1, _ = pool.allocate(4, [])
    assert pool.free_count() == 1
    with pytest.raises(OutOfBlocks):
        pool.allocate(3, [])
    assert not pool.can_grow(t1, 7) and pool.can_grow(t1, 6)
    pool.grow(t1, 6)
    assert len(t1) == 3 and pool.free_count() == 0
    pool.release(t1)
    with pytest.raises(AssertionError):
        pool.release([t1_block for t1_block in [1]])  # released twice
    assert block_hash(b"", [1, 2]) != block_hash(b"", [2, 1])


def test_a_prefill_layout_puts_each_token_in_its_row_and_its_blocks_slot():
    """``paged_prefill.layout``: rows of different pasts and new tokens, blocks of 4 scattered in the pool."""
    a = Sequence(prompt=[11, 12, 13, 14, 15, 16], max_new=4, table=[5, 2])  # tokens 3..5 new (3 cached)
    b = Sequence(prompt=[21, 22], max_new=4, table=[7])  # a fresh prompt: both tokens new
    lay = layout([(a, 3, 6), (b, 0, 2)], block_size=4, pad_id=0)
    assert lay.ids.tolist() == [[14, 15, 16], [21, 22, 0]]
    assert lay.pos.tolist() == [[3, 4, 5], [0, 1, 0]]
    assert lay.valid.tolist() == [[True, True, True, True, True, True], [False, False, False, True, True, False]]
    assert lay.past_idx.tolist() == [[20, 21, 22], [0, 0, 0]]  # token t of a: block table[t // 4], slot t % 4
    assert lay.slots.tolist() == [23, 8, 9, 28, 29, 0]  # a's tokens 3, 4, 5, b's 0, 1, b's pad to the scratch block
    assert lay.n.tolist() == [3, 2]


# -- the scheduler -------------------------------------------------------------------------------------

def run_schedule(sched: Scheduler, steps: int = 200) -> list[str]:
    """Drive the scheduler as the engine does, with a fake sample of token 7."""
    kinds = []
    for _ in range(steps):
        step = sched.schedule()
        if step is None:
            break
        kinds.append(step.kind)
        for s in step.seqs:
            if step.kind == "prefill":
                s.kv_len = s.length
                sched.registered(s)
            else:
                s.kv_len += 1
            s.generated.append(7)
            if len(s.generated) >= s.max_new:
                s.finish = "length"
                sched.finished(s)
    return kinds


def test_siblings_share_one_prefill_and_calls_join_between_steps():
    pool = BlockPool(64, 4)
    sched = Scheduler(pool, max_seqs=16, prefill_tokens=1000)
    prompt = list(range(22))  # 5 full blocks and a partial one
    group = [Sequence(list(prompt), 6) for _ in range(4)]
    longer = Sequence(prompt + [90, 91, 92, 93, 94], 6)  # starts like the group: waits for its blocks
    for s in group + [longer]:
        sched.add(s)
    first = sched.schedule()
    assert first.kind == "prefill" and first.seqs == group  # one prefill, three forks, the same step
    assert [s.fork_of for s in group] == [None] + [group[0]] * 3
    assert all(s.table[:5] == group[0].table[:5] and s.table[5] != group[0].table[5] for s in group[1:])
    assert [pool.ref[b] for b in group[0].table] == [4] * 5 + [1]
    assert sched.stats["prefill_tokens"] == 22 and sched.stats["forks"] == 3
    for s in group:
        s.kv_len, s.fork_of = s.length, None
    sched.registered(group[0])
    for s in group:
        s.generated.append(7)
    second = sched.schedule()
    assert second.kind == "prefill" and second.seqs == [longer] and longer.cached == 20  # the group's full blocks
    assert sched.stats["prefill_tokens"] == 22 + 7
    for s in second.seqs:
        s.kv_len = s.length
        s.generated.append(7)
    assert sched.schedule().kind == "decode"
    late = Sequence(list(range(100, 105)), 2)
    sched.add(late)  # arrives mid-decode: prefilled at the next step, then decodes with the others
    step = sched.schedule()
    assert step.kind == "prefill" and step.seqs == [late]
    late.kv_len = late.length
    late.generated.append(7)
    assert late in sched.schedule().seqs
    run_schedule(sched)
    assert sched.idle() and pool.used() == 0


def test_preemption_requeues_and_every_call_finishes():
    pool = BlockPool(7, 4)  # 6 usable blocks = 24 slots
    sched = Scheduler(pool, max_seqs=8, prefill_tokens=1000)
    seqs = [Sequence(list(range(10 * i, 10 * i + 5)), 10) for i in range(3)]  # each needs 15 slots = 4 blocks
    for s in seqs:
        sched.add(s)
    kinds = run_schedule(sched)
    assert all(s.finish == "length" and len(s.generated) == 10 for s in seqs)
    assert sched.stats["preemptions"] > 0 and "prefill" in kinds[1:]
    assert sched.idle() and pool.used() == 0
    with pytest.raises(ValueError, match="needs 7 KV blocks; the pool holds 6"):
        sched.add(Sequence(list(range(20)), 8))


# -- the engine on a real tiny Llama -----------------------------------------------------------------

def prompts(tok, n=6):
    sys_ = "You are a careful assistant. Answer with one number inside answer tags, please, always."
    out = [tok(f"{sys_} Question {i}: what is {i} plus {i * 3}?", add_special_tokens=False)["input_ids"]
           for i in range(n)]
    return out + [tok("a different start", add_special_tokens=False)["input_ids"]]


@pytest.mark.parametrize("sync_every,prefill_tokens", [(8, 8192), (1, 8192), (3, 24)])
def test_paged_greedy_equals_the_eager_engine_and_logprobs_match_a_full_forward(tiny, sync_every, prefill_tokens):
    """Calls of different lengths finish inside decode chunks (sync_every); prefill_tokens=24 splits
    every prompt into chunks computed over the blocks before them (chunked prefill)."""
    model, tok = tiny
    reqs = [req(p, max_new_tokens=2 + 3 * i) for i, p in enumerate(prompts(tok))]
    eager = HFEngine(model, tok, [2]).generate(reqs)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=256, block_size=4, sync_every=sync_every,
                      prefill_tokens=prefill_tokens)
    outs = eng.generate(reqs)
    for a, b in zip(eager, outs):
        assert a.completion_ids == b.completion_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert eng.stats["cached_tokens"] > 0  # the shared system prompt was computed once
    # sampled rows: the logprobs are those of the tokens under softmax(logits / T)
    sampled = [req(p, temperature=t, max_new_tokens=6, seed=i) for i, (p, t) in enumerate(zip(prompts(tok), [1.0, 0.7, 1.3]))]
    for r, o in zip(sampled, eng.generate(sampled)):
        ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        assert torch.allclose(ref, torch.tensor(o.logprobs), atol=1e-4)
    assert eng.sched.idle() and eng.pool.used() == 0


def test_a_group_prefills_once_and_a_seed_gives_the_same_tokens_in_any_company(tiny):
    model, tok = tiny
    p = prompts(tok)[0]
    group = [req(p, temperature=1.0, max_new_tokens=8, seed=100 + i) for i in range(8)]
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4)
    outs = eng.generate(group)
    assert len(p) % 4  # a partial last block, which each sample copies (their tokens go on differently)
    assert eng.stats["prefill_tokens"] == len(p) and eng.stats["forks"] == 7  # one prefill for the group
    alone = [PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4).generate([r])[0] for r in group[:3]]
    assert [o.completion_ids for o in alone] == [o.completion_ids for o in outs[:3]]
    assert len({tuple(o.completion_ids) for o in outs}) > 1  # different seeds, different samples


@pytest.mark.parametrize("overlap", [False, True], ids=["chunk-by-chunk", "overlapped"])
def test_a_tight_budget_preempts_and_changes_no_token(tiny, overlap):
    model, tok = tiny
    reqs = [req(p, max_new_tokens=24) for p in prompts(tok)]
    roomy = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4).generate(reqs)
    need = max(len(r.prompt_ids) + 24 for r in reqs)
    tight = PagedEngine(model, tok, [2], device="cpu", kv_blocks=need // 4 + 6, block_size=4, overlap_chunks=overlap)
    outs = tight.generate(reqs)
    assert tight.stats["preemptions"] > 0 and (tight.stats["overlapped_chunks"] > 0) == overlap
    assert tight.stats["peak_blocks"] <= need // 4 + 5
    for a, b in zip(roomy, outs):
        assert a.completion_ids == b.completion_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    # what a step's metrics report: the pre-emptions and the fullest pool since the last take, then afresh
    taken = tight.take_counters()
    assert taken["preemptions"] == tight.stats["preemptions"] and 0.5 < taken["pool_peak"] <= 1.0
    assert tight.take_counters() == {"preemptions": 0.0, "pool_peak": 0.0}  # nothing ran since (all calls done)


def test_one_call_too_big_for_the_budget_fails_alone(tiny):
    model, tok = tiny
    ps = prompts(tok)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=17, block_size=4)  # 64 slots
    reqs = [req(ps[0], max_new_tokens=4), req(ps[1] * 4, max_new_tokens=4), req(ps[2], max_new_tokens=4)]
    outs = eng.generate(reqs)
    assert isinstance(outs[1], PromptError) and "raise rollout.gpu_memory_utilization" in str(outs[1])
    alone = HFEngine(model, tok, [2]).generate([reqs[0], reqs[2]])
    assert [outs[0].completion_ids, outs[2].completion_ids] == [o.completion_ids for o in alone]


def test_calls_from_another_thread_join_a_running_decode(tiny):
    model, tok = tiny
    ps = prompts(tok)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4)
    long_call = [req(ps[0], max_new_tokens=120)]
    short_calls = [req(ps[1], max_new_tokens=3), req(ps[2], max_new_tokens=3)]
    done: dict[str, float] = {}

    def run_long():
        eng.generate(long_call)
        done["long"] = time.monotonic()

    t = threading.Thread(target=run_long)
    t.start()
    while eng.stats["decode_steps"] < 5:
        time.sleep(0.005)
    shorts = eng.generate(short_calls)
    done["short"] = time.monotonic()
    steps_when_short_done = eng.stats["decode_steps"]
    t.join(timeout=120)
    assert done["short"] < done["long"]  # the short calls did not wait for the long one's end
    assert steps_when_short_done < 60 and eng.stats["joined"] == 2
    alone = HFEngine(model, tok, [2]).generate(short_calls + long_call)
    assert [o.completion_ids for o in shorts] == [o.completion_ids for o in alone[:2]]


def test_the_next_turn_reuses_its_episode_blocks(tiny):
    model, tok = tiny
    p = prompts(tok)[3]
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4)
    first = eng.generate([req(p, max_new_tokens=16)])[0]
    turn2 = p + first.completion_ids + tok(" And then? Tell me more.", add_special_tokens=False)["input_ids"]
    before = eng.stats["prefill_tokens"]
    second = eng.generate([req(turn2, max_new_tokens=4)])[0]
    computed = eng.stats["prefill_tokens"] - before
    assert computed <= len(turn2) - (len(p) + 15) // 4 * 4 + 4  # only the new message and a partial block
    assert second.completion_ids == HFEngine(model, tok, [2]).generate([req(turn2, max_new_tokens=4)])[0].completion_ids


def test_next_turns_with_a_long_past_and_few_new_tokens_prefill_together(tiny, monkeypatch):
    """Rows are batched by their new tokens, not by their whole length (a next turn's past is cached):
    seven next turns of ~40 tokens with ~10 new each take at most three forward passes under a 64-token budget (one
    a row if the past counted in full), and sample the eager engine's tokens."""
    model, tok = tiny
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4, prefill_tokens=64)
    firsts = [req(p, max_new_tokens=6) for p in prompts(tok)[:8]]
    more = tok(" And then? Tell me.", add_special_tokens=False)["input_ids"]
    turn2 = [req(r.prompt_ids + o.completion_ids + more, max_new_tokens=5) for r, o in zip(firsts, eng.generate(firsts))]
    passes = []
    real = eng.runner.prefill_pool.rows
    monkeypatch.setattr(eng.runner.prefill_pool, "rows", lambda spans, *a: passes.append(len(spans)) or real(spans, *a))
    outs = eng.generate(turn2)
    assert sum(passes) == len(turn2) and len(passes) <= 3, passes
    assert [o.completion_ids for o in outs] == [o.completion_ids for o in HFEngine(model, tok, [2]).generate(turn2)]


def test_token_rows_lay_calls_end_to_end_at_their_positions():
    """Three calls with 2, 0 and 3 new tokens after 5, 9 and 0 cached ones: rows 0-1 are call 0 at positions
    5-6, rows 2-4 call 2 at 0-2; a call with no new tokens has no row (its last row is the row before)."""
    row_of, pos, last = token_rows(np.array([2, 0, 3]), np.array([5, 9, 0]))
    assert row_of.tolist() == [0, 0, 2, 2, 2]
    assert pos.tolist() == [5, 6, 0, 1, 2]
    assert last.tolist() == [1, 1, 4]


def test_a_prefill_as_token_rows_of_the_decode_step_equals_the_eager_engine(tiny, monkeypatch):
    """``graph_prefill`` (default: on only where CUDA graphs replay, so off here): a prefill's new tokens are
    rows of the decode step,
    each over its call's blocks, 8 rows a replay here so one call's tokens span replays and one replay
    holds several calls. First turns, a sampled group that forks from one prefill, then next turns over
    their cached past: the eager engine's greedy tokens and a full forward's logprobs, no lean forward run."""
    model, tok = tiny
    assert not PagedEngine(model, tok, [2], device="cpu", kv_blocks=8).runner.graph_prefill  # the default: no graphs on a CPU
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4, graph_prefill=True, prefill_rows=8)
    forward, real = [], eng.runner.prefill_pool.rows
    monkeypatch.setattr(eng.runner.prefill_pool, "rows", lambda *a: forward.append(len(a[0])) or real(*a))
    firsts = [req(p, max_new_tokens=6) for p in prompts(tok)]
    outs = eng.generate(firsts)
    eager = HFEngine(model, tok, [2])
    assert [o.completion_ids for o in outs] == [o.completion_ids for o in eager.generate(firsts)]
    group = [req(prompts(tok)[2], temperature=1.0, max_new_tokens=5, seed=40 + i) for i in range(4)]
    more = tok(" And then? Tell me.", add_special_tokens=False)["input_ids"]
    turn2 = [req(r.prompt_ids + o.completion_ids + more, max_new_tokens=5) for r, o in zip(firsts, outs)]
    for r, o in zip(group + turn2, eng.generate(group + turn2)):
        ref = full_logprobs(model, r.prompt_ids, o.completion_ids, r.sampling.temperature)
        assert torch.allclose(ref, torch.tensor(o.logprobs), atol=1e-4)
    assert [o.completion_ids for o in eng.generate(turn2)] == [o.completion_ids for o in eager.generate(turn2)]
    assert eng.stats["forks"] >= 3 and eng.stats["cached_tokens"] > 0
    assert eng.stats["row_prefills"] > 0 and eng.stats["forward_prefills"] == 0 and not forward
    # rows that would read too many keys take the lean forward
    eng.runner.rows_keys = 0
    eng.generate(firsts[:2])
    assert eng.stats["forward_prefills"] > 0 and forward


def test_stop_strings_and_eos_end_a_call_inside_a_decode_chunk(tiny):
    model, tok = tiny
    p = prompts(tok)[2]
    free = HFEngine(model, tok, [2]).generate([req(p, max_new_tokens=20)])[0]
    stop_tok = free.completion_ids[5]  # a token the call samples sixth: as EOS, it ends the call there
    eager = HFEngine(model, tok, [stop_tok]).generate([req(p, max_new_tokens=20)])[0]
    paged = PagedEngine(model, tok, [stop_tok], device="cpu", kv_blocks=64, block_size=4, sync_every=8)
    out = paged.generate([req(p, max_new_tokens=20)])[0]
    assert out.completion_ids == eager.completion_ids and out.finish_reason == "stop"
    assert out.completion_ids[-1] == stop_tok and len(out.completion_ids) <= 6
    text = tok.decode(free.completion_ids[:9], skip_special_tokens=True)
    stop = text[-3:]
    a = HFEngine(model, tok, [2]).generate([req(p, max_new_tokens=20, stop=[stop])])[0]
    plain = PagedEngine(model, tok, [2], device="cpu", kv_blocks=64, block_size=4, sync_every=8)
    b = plain.generate([req(p, max_new_tokens=20, stop=[stop])])[0]
    assert a.completion_ids == b.completion_ids and b.finish_reason == "stop"


@pytest.mark.parametrize("overlap", [False, True], ids=["chunk-by-chunk", "overlapped"])
def test_weights_change_between_steps_of_a_running_call_and_its_blocks_stay_out_of_the_cache(overlap):
    """at_boundary (AReaL's interruptible generation): a weight change requested while a call decodes
    runs at the next step boundary (overlapped: once the chunk in flight is taken); the call goes on with
    the new weights (its tokens change from there), and its blocks, computed partly under the old
    weights, never join the prefix cache."""
    from masrl.models import load_model

    model, tok = load_model("tiny-random", seed=0)  # its own copy: the test changes its weights
    p = prompts(tok)[0]
    call = [req(p, max_new_tokens=40)]
    eng = PagedEngine(model, tok, [], device="cpu", kv_blocks=512, block_size=4, sync_every=2, overlap_chunks=overlap)
    before = eng.generate(call)[0].completion_ids
    assert eng.generate(call)[0].completion_ids == before  # greedy: the same tokens run to run

    def swap():
        with torch.no_grad():
            model.model.norm.weight.mul_(-1.0)  # every logit negated: the greedy token changes
        eng.weights_updated()

    step, calls = eng._step, [0]
    asker = threading.Thread(target=eng.at_boundary, args=(swap,))

    def stepping():  # on the third step, ask for the change from another thread and wait until it waits
        calls[0] += 1
        if calls[0] == 3:
            asker.start()
            while not eng._boundary:
                time.sleep(0.001)
        return step()

    eng._step = stepping
    after = eng.generate(call)[0].completion_ids
    asker.join(5)
    eng._step = step
    same = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), len(after))
    print(f"tokens before the change: {same} of {len(after)}; swaps mid-call {eng.stats['swaps_mid_call']}")
    assert eng.stats["swaps_mid_call"] == 1 and (eng.stats["overlapped_chunks"] > 0) == overlap
    assert 1 <= same < len(after)  # the first tokens are the old weights', the rest the new ones'
    cached = eng.stats["cached_tokens"]
    eng.generate(call)
    assert eng.stats["cached_tokens"] == cached  # nothing of the interrupted call was offered to the cache


def test_a_pool_that_does_not_fit_says_which_setting_to_lower_and_the_engine_can_try_again(tiny, monkeypatch):
    """No GPU here: torch's CUDA out-of-memory error is raised where the pool's allocation would raise it."""
    import masrl.engines.paged.blocks as kv_pool

    model, tok = tiny

    class FullDevice:  # torch, except that the pool's first allocation finds the device full
        fail = True

        def __getattr__(self, name):
            return getattr(torch, name)

        def zeros(self, *a, **k):
            if FullDevice.fail:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
            return torch.zeros(*a, **k)

    monkeypatch.setattr(kv_pool, "torch", FullDevice())
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=64, block_size=4)
    r = req(prompts(tok)[0], max_new_tokens=3)
    with pytest.raises(RuntimeError, match=r"KV pool \(.* GiB\) does not fit on cpu.*rollout.gpu_memory_utilization"):
        eng.generate([r])
    FullDevice.fail = False  # memory freed elsewhere: the next call builds the pool and runs
    assert len(eng.generate([r])[0].completion_ids) == 3


def test_decode_graphs_of_long_rows_get_their_own_length_class_and_launch():
    from masrl.engines.paged.kernels import paged as pk

    long = pk.PAGED_LONG_KEYS
    assert pk.paged_length_class(1) == pk.paged_length_class(long) == 0
    assert pk.paged_length_class(long + 1) == pk.paged_length_class(16 * long) == long
    short_bf16, long_bf16 = pk.paged_launch(torch.bfloat16, 0), pk.paged_launch(torch.bfloat16, long)
    assert short_bf16 == pk.PAGED_LAUNCH["lowp"] and long_bf16 == pk.PAGED_LAUNCH["lowp_long"]
    assert short_bf16["BLOCK"] < long_bf16["BLOCK"] and short_bf16["LOWP"] and long_bf16["LOWP"]
    # an fp32 pool never rounds to 16 bits, whatever the length
    assert not pk.paged_launch(torch.float32, long)["LOWP"] and not pk.paged_launch(torch.float32, 0)["LOWP"]
    launch = pk.paged_launch(torch.bfloat16, 0)
    launch["BLOCK"] = 1  # a copy: changing it leaves the shipped settings alone
    assert pk.PAGED_LAUNCH["lowp"]["BLOCK"] != 1


@pytest.mark.parametrize("overlap", [False, True], ids=["chunk-by-chunk", "overlapped"])
def test_a_short_call_is_told_before_the_long_call_of_its_batch_ends(tiny, overlap):
    """``on_done``: each call is handed back as it finishes, with the output the list ends with, so a
    short call of a batch need not wait for the batch's longest (overlapped: the next chunk is queued
    before the host takes a chunk's tokens, so a call is told one chunk of steps later)."""
    model, tok = tiny
    ps = prompts(tok)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4, overlap_chunks=overlap)
    calls = [req(ps[0], max_new_tokens=80), req(ps[1], max_new_tokens=2), req(ps[2], max_new_tokens=5)]
    told: list[tuple[int, int, object]] = []  # (index, decode steps run when told, output)

    outs = eng.generate(calls, on_done=lambda i, o: told.append((i, eng.stats["decode_steps"], o)))
    assert [i for i, _, _ in told] == [1, 2, 0]  # in the order they finished
    steps = {i: n for i, n, _ in told}
    assert steps[1] <= steps[2] < steps[0] and steps[2] <= 8 * (1 + overlap)  # the short ones in the first chunk
    for i, _, o in told:
        assert o.completion_ids == outs[i].completion_ids and o.logprobs == outs[i].logprobs


def test_a_caller_woken_while_its_call_is_being_told_waits_for_the_callback(tiny):
    """The thread running the steps tells a call's ``on_done`` after marking it finished; a third
    caller arriving meanwhile wakes every waiter. The call's own caller must not take its list before
    the callback returned (the worker would make that call's result twice)."""
    model, tok = tiny
    ps = prompts(tok)
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4)
    events: dict[str, float] = {}
    in_callback = threading.Event()

    def slow_told(i, o):
        in_callback.set()
        time.sleep(0.3)
        events["told"] = time.monotonic()

    runner = threading.Thread(target=lambda: eng.generate([req(ps[0], max_new_tokens=300)]))
    runner.start()
    while eng.stats["decode_steps"] < 2:  # the long call's thread runs the steps
        time.sleep(0.002)

    def short():
        eng.generate([req(ps[1], max_new_tokens=2)], on_done=slow_told)
        events["returned"] = time.monotonic()

    waiter = threading.Thread(target=short)
    waiter.start()
    assert in_callback.wait(timeout=60)
    eng.generate([req(ps[2], max_new_tokens=1)])  # joins: wakes every waiting caller mid-callback
    waiter.join(timeout=60)
    runner.join(timeout=120)
    assert events["told"] <= events["returned"]


def test_callers_arriving_at_a_fresh_engine_at_once_build_one_pool(tiny, monkeypatch):
    """Several batches reach a new engine together (a paged host's batcher hands over up to 64): the
    pool and its cache are built once, and no caller runs steps on a pool whose cache is not there."""
    import masrl.engines.paged.blocks as kv_pool

    model, tok = tiny
    built, slow = [], threading.Event()

    class SlowAlloc:  # torch, with the pool's allocation taking its time (as 5 GiB on a GPU does)
        def __getattr__(self, name):
            return getattr(torch, name)

        def zeros(self, *a, **k):
            if a and isinstance(a[0], tuple) and a[0][0] == 256 * 4:  # a pool tensor: [slots, kv heads, dim]
                built.append(1)
                slow.wait(0.05)
            return torch.zeros(*a, **k)

    monkeypatch.setattr(kv_pool, "torch", SlowAlloc())
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=256, block_size=4)
    ps = prompts(tok)
    outs: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: outs.__setitem__(i, eng.generate([req(ps[i], max_new_tokens=4)])))
               for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(built) == 2 * model.config.num_hidden_layers  # one key and one value tensor a layer, once
    assert sorted(outs) == [0, 1, 2, 3] and all(len(o[0].completion_ids) == 4 for o in outs.values())


def test_overlapped_chunks_give_the_tokens_of_chunks_taken_one_by_one(tiny):
    """``overlap_chunks``: the next decode chunk is queued from the device's last tokens and positions before
    the host takes the chunk in flight. Greedy and seeded calls of several lengths, stop strings, a
    group that forks and calls that join from another thread: the same tokens and logprobs as chunk by
    chunk, at several chunk lengths, and chunks did overlap."""
    model, tok = tiny
    ps = prompts(tok)
    text = tok.decode(HFEngine(model, tok, [2]).generate([req(ps[1], max_new_tokens=12)])[0].completion_ids[:7])
    calls = ([req(p, max_new_tokens=5 + 6 * i) for i, p in enumerate(ps)]
             + [req(ps[0], temperature=1.0, max_new_tokens=17, seed=40 + i) for i in range(3)]
             + [req(ps[1], max_new_tokens=20, stop=[text[-3:]])])
    late = [req(ps[2], temperature=1.0, max_new_tokens=9, seed=7), req(ps[3], max_new_tokens=4)]
    for sync_every in (1, 3, 8):
        got, lps = {}, {}
        for overlap in (False, True):
            eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=512, block_size=4, sync_every=sync_every,
                              overlap_chunks=overlap)
            side: list = []
            t = threading.Thread(target=lambda e=eng, out=side: (time.sleep(0.05), out.extend(e.generate(late))))
            t.start()
            outs = eng.generate(calls)
            t.join(60)
            got[overlap] = [(o.completion_ids, o.finish_reason) for o in outs + side]
            lps[overlap] = [o.logprobs for o in outs + side]
            assert (eng.stats["overlapped_chunks"] > 0) == overlap
        assert got[True] == got[False] and len(got[True]) == len(calls) + len(late)
        assert all(np.allclose(a, b, atol=1e-4) for a, b in zip(lps[False], lps[True]))
        assert any(reason == "stop" for _, reason in got[True])
