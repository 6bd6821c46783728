"""One call's prompt that cannot run (it does not tokenise, or is far too long to try) fails that call
alone: in a worker's batch, and in a rollout, where only its own episode fails."""

from __future__ import annotations

import asyncio

from tinycfg import prepared_trainer, tiny_config

from masrl.config import SamplingParams
from masrl.data.tasks import Task
from masrl.errors import PromptError
from masrl.messages import GenCall, GenResult


def _call(i: int, content: str) -> GenCall:
    return GenCall(f"c{i}", "shared", [{"role": "user", "content": content}],
                   SamplingParams(temperature=1.0, max_new_tokens=4, stop=[]), seed=i)


def test_a_bad_prompt_in_a_worker_batch_fails_only_its_own_call(tmp_path):
    tr, workers, _ = prepared_trainer(tiny_config("math/team_shared", tmp_path, steps=1), tmp_path)
    w = workers["shared"]
    calls = [_call(0, "What is 1 + 1?"), _call(1, "a\ud800b"), _call(2, "What is 2 + 2?"),
             _call(3, "x" * (w.sampler.context_limit() * 40))]
    out = w.generate(calls)
    assert isinstance(out[0], GenResult) and isinstance(out[2], GenResult)
    assert isinstance(out[1], PromptError) and "could not be rendered and tokenised" in str(out[1])
    assert isinstance(out[3], PromptError) and "refused before tokenising" in str(out[3])
    assert set(w.sampler.buffer) == {"c0", "c2"}  # only the calls that ran are kept for training
    # the same seeds alone give the same tokens: the bad calls changed nothing for the good ones
    alone = w.generate([_call(0, "What is 1 + 1?"), _call(2, "What is 2 + 2?")])
    assert [r.text for r in alone] == [out[0].text, out[2].text]
    tr.rt.close()


def test_an_episode_whose_prompt_cannot_run_fails_alone(tmp_path):
    tr, _, _ = prepared_trainer(tiny_config("math/solver", tmp_path, steps=1), tmp_path)
    tasks = [Task("good-1", "What is 3 + 4?", "7"), Task("bad", "What is 1 + \ud800?", "1"),
             Task("good-2", "What is 5 + 1?", "6")]

    async def go():
        try:
            return await tr.rt.controller.rollout(tasks, 3, train=True, seed=1)
        finally:
            await tr.rt.controller.aclose()

    traces = asyncio.run(go())
    failed = {t.task_id for t in traces if t.failed}
    assert failed == {"bad"} and sum(t.failed for t in traces) == 3
    assert all("could not be rendered and tokenised" in t.error for t in traces if t.failed)
    assert all(not t.calls for t in traces if t.failed)  # the refused call never reached the trace
    assert all(t.calls and t.calls[0].completion is not None for t in traces if not t.failed)
    tr.rt.close()
