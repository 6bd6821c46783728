"""A training run on the paged engine (CPU, tiny-random): the same steps as on the eager engine,
call for call, and the batches overlap (calls join the running decode); then the math team's LoRA
config, whose engine batches mix adapters."""

import asyncio

from tinycfg import prepared_trainer, tiny_config


def two_steps(data, run_dir):
    tr, workers, _ = prepared_trainer(data, run_dir)
    recs, completions = [], []
    for _ in range(2):
        recs.append(asyncio.run(tr.train_step()))
        completions.append(sorted((c.task_id, c.sample_idx, c.agent, c.turn, c.completion) for t in tr.last_traces
                                  for c in t.calls))
    engines = [w.sampler.engine for w in tr.rt.workers]
    batchers = tr.rt.controller.batchers
    tr.rt.close()
    return recs, completions, engines, batchers


def test_paged_engine_trains_the_same_steps_as_the_eager_engine(tmp_path):
    eager = two_steps(tiny_config("math/team_shared", tmp_path / "hf", rollout__engine="hf"), tmp_path / "s")
    paged = two_steps(tiny_config("math/team_shared", tmp_path / "paged", rollout__engine="paged",
                                  rollout__gpu_memory_utilization=0.01), tmp_path / "p")
    assert type(paged[2][0]).__name__ == "PagedEngine" and type(eager[2][0]).__name__ == "HFEngine"
    assert paged[1] == eager[1]  # every call's completion, step by step
    for a, b in zip(eager[0], paged[0]):
        for name, pa in a["policies"].items():
            pb = b["policies"][name]
            assert abs(pa["reward_mean"] - pb["reward_mean"]) < 1e-9
            assert abs(pa["loss"] - pb["loss"]) < 1e-3
    eng = paged[2][0]
    assert eng.stats["cached_tokens"] > 0  # the agents' shared prompts were computed once
    assert paged[3][0].concurrent > 1 and eager[3][0].concurrent == 1


def test_paged_engine_runs_a_lora_team(tmp_path):
    recs, completions, engines, _ = two_steps(
        tiny_config("math/team_lora", tmp_path / "lora", rollout__engine="paged", rollout__kv_block_size=8),
        tmp_path / "l")
    assert len(recs[-1]["policies"]) == 4 and all(c for step in completions for c in step)
    assert engines[0].adapters() and engines[0].stats["decode_steps"] > 0


def test_async_rollouts_on_the_paged_engine_never_sample_during_an_update(tmp_path):
    """rollout.mode async on the paged engine without a weight copy (a CPU): batches overlap one
    another, but none runs while the host updates (the batcher's SharedLock), so every call is
    sampled by one version of the weights and trained once."""
    from tinycfg import run_async

    data = tiny_config("math/team_shared", tmp_path / "async", rollout__engine="paged",
                       rollout__gpu_memory_utilization=0.01, rollout__mode="async", rollout__tasks_per_step=2,
                       rollout__samples_per_task=2, steps=3)
    tr, workers, _ = prepared_trainer(data, tmp_path / "a")
    w = tr.rt.workers[0]
    lock = tr.rt.controller.batchers[0].compute_lock
    updating, seen = [False], []
    generate, train = w.generate, w.train_step

    def gen(calls, *deliver):  # (a paged host's batcher streams: run_batch(calls, deliver))
        seen.append(updating[0])
        out = generate(calls, *deliver)
        seen.append(updating[0])
        return out

    def train_step(*a, **k):
        updating[0] = True
        try:
            return train(*a, **k)
        finally:
            updating[0] = False

    w.train_step = train_step
    tr.rt.controller.batchers[0].run_batch = gen
    try:
        recs, traces = run_async(tr, 3)
    finally:
        tr.rt.close()
    assert seen and not any(seen)  # no batch started or ended while the host was updating
    assert not w.overlaps_update and type(lock).__name__ == "SharedLock"
    assert sum(r["policies"]["shared"]["n_seqs"] for r in recs) == sum(len(t.calls) for t in traces)
    assert max(c.policy_version for t in traces for c in t.calls) >= 1


def test_closing_a_run_frees_its_paged_pool(tmp_path):
    """A run's ``close`` releases its engine's KV pool at once (it is a fixed share of the device), and
    a later ``generate`` on the same engine rebuilds it."""
    data = tiny_config("math/team_shared", tmp_path / "close", rollout__engine="paged",
                       rollout__gpu_memory_utilization=0.01)
    tr, workers, _ = prepared_trainer(data, tmp_path / "c")
    asyncio.run(tr.train_step())
    eng = tr.rt.workers[0].sampler.engine
    assert eng.runner.kv and eng.pool is not None
    tr.rt.close()
    assert eng.runner.kv == [] and eng.pool is None and not eng.runner.graphs
    from masrl.config import SamplingParams
    from masrl.messages import GenRequest

    out = eng.generate([GenRequest([5, 6, 7, 8], SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=4))])
    assert 1 <= len(out[0].completion_ids) <= 4 and eng.pool is not None


def test_a_paged_hosts_short_call_comes_back_before_the_long_call_of_its_batch(tmp_path):
    """Through the run's own batcher and worker: two calls in one batch, one of 2 tokens and one of 200;
    the short one's caller has its result (and the worker its training sample) while the long one still
    runs, so an episode's next turn need not wait for another episode's long call. A call that asks for
    logprobs is scored after the batch, as before."""
    from masrl.config import SamplingParams
    from masrl.messages import GenCall

    data = tiny_config("math/team_shared", tmp_path / "s", rollout__engine="paged",
                       rollout__gpu_memory_utilization=0.01)
    tr, workers, _ = prepared_trainer(data, tmp_path / "s")
    w, b = tr.rt.workers[0], tr.rt.controller.batchers[0]
    assert b.streams and w.joins_batches

    def call(i, n, logprobs=None):
        return GenCall(f"c{i}", "shared", [{"role": "user", "content": f"What is {i} + 1?"}],
                       SamplingParams(temperature=1.0, max_new_tokens=n, stop=(), ignore_eos=True), seed=i,
                       key={"task_id": f"t{i}", "agent": "solver", "turn": 0}, logprobs=logprobs)

    async def main():
        long = asyncio.ensure_future(b.submit(call(0, 200)))
        short = asyncio.ensure_future(b.submit(call(1, 2)))
        scored = asyncio.ensure_future(b.submit(call(2, 2, logprobs=0)))
        got = await short
        state = (long.done(), scored.done(), "c1" in w.sampler.buffer, "c0" in w.sampler.buffer)
        rest = await asyncio.gather(long, scored)
        await b.aclose()
        return got, state, rest

    try:
        got, state, (long_res, scored_res) = asyncio.run(main())
    finally:
        tr.rt.close()
    assert b.stats.batches == 1 and b.stats.items == 3  # one batch
    assert state == (False, False, True, False)  # the short call back, its sample kept; the long one running
    assert got.n_completion_tokens == 2 and long_res.n_completion_tokens == 200
    assert len(scored_res.logprobs) == 2 and len(w.sampler.buffer) == 3


def test_a_bad_prompt_beside_good_ones_in_a_streaming_batch_fails_alone(tmp_path):
    """One batch of a paged host: a prompt too long to tokenise between two good calls. The good ones come
    back (early, one by one) with their samples kept; the bad one gets its own PromptError."""
    from masrl.config import SamplingParams
    from masrl.errors import PromptError
    from masrl.messages import GenCall
    from masrl.worker.sampler.prompts import MAX_BYTES_PER_TOKEN

    data = tiny_config("math/team_shared", tmp_path / "bad", rollout__engine="paged",
                       rollout__gpu_memory_utilization=0.01)
    tr, workers, _ = prepared_trainer(data, tmp_path / "bad")
    w, b = tr.rt.workers[0], tr.rt.controller.batchers[0]
    huge = "x" * (w.sampler.context_limit() * MAX_BYTES_PER_TOKEN + 1)

    def call(i, text):
        return GenCall(f"c{i}", "shared", [{"role": "user", "content": text}],
                       SamplingParams(temperature=1.0, max_new_tokens=4, stop=(), ignore_eos=True), seed=i,
                       key={"task_id": f"t{i}", "agent": "solver", "turn": 0})

    async def main():
        out = await asyncio.gather(b.submit(call(0, "What is 1 + 1?")), b.submit(call(1, huge)),
                                   b.submit(call(2, "What is 2 + 2?")), return_exceptions=True)
        await b.aclose()
        return out

    try:
        good0, bad, good2 = asyncio.run(main())
    finally:
        tr.rt.close()
    assert b.stats.batches == 1 and b.stats.items == 3
    assert isinstance(bad, PromptError) and "bytes" in str(bad)
    assert good0.n_completion_tokens == 4 and good2.n_completion_tokens == 4
    assert sorted(w.sampler.buffer) == ["c0", "c2"]
