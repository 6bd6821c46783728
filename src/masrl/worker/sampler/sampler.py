"""A policy worker's calls made samples: prompts checked one by one, one engine batch, results kept.

``generate`` is ``PolicyWorker.generate``: each call is checked, rendered and tokenised on its own, so
one bad prompt fails its own call (a ``PromptError`` in its place) and the others run as one engine
batch. Each result records the version of the weights its call started on; a trainable policy's call
that asked to be recorded is buffered as a ``Sample`` (exact token ids and sampling logprobs) for the
update.
"""

from __future__ import annotations

import contextlib

from masrl.messages import GenCall, GenRequest, GenResult
from masrl.worker.sampler.logprobs import token_logprobs
from masrl.worker.updater.training import Sample


def generate(worker, calls: list[GenCall], on_result=None) -> list[GenResult | Exception]:
    """``on_result(i, result)``, for a worker whose engine joins batches (``joins_batches``): told of
    call ``i`` as soon as it finishes, before the batch's last call does (calls that ask for
    ``logprobs`` are scored after the batch, and told then)."""
    worker._resident()
    prompts = worker.prompts.prepare(calls, worker.context_limit())
    live = [i for i, p in enumerate(prompts) if not isinstance(p, Exception)]
    requests = [GenRequest(prompts[i], calls[i].sampling, adapter=worker.host.adapter_for(calls[i].policy),
                           seed=calls[i].seed) for i in live]
    done: dict[int, GenResult | Exception] = {}
    versions: dict[str, int] = {}
    early = None
    if on_result is not None and worker.joins_batches:
        def early(j, o):  # from the engine's stepping thread, between two steps
            i = live[j]
            if calls[i].logprobs is None:
                done[i] = result_of(worker, calls[i], prompts[i], o, versions)
                on_result(i, done[i])
    # each call's version: the weights it started on (with swaps_mid_call later tokens may be newer;
    # without, a publish waits for this batch, so they are the batch's weights throughout)
    with contextlib.nullcontext() if worker.swaps_mid_call else worker._engine_lock:
        versions.update(worker.published)
        outputs = []
        if requests:  # (an engine that cannot tell calls one by one is never given on_done)
            outputs = worker.engine.generate(requests, early) if early else worker.engine.generate(requests)
    output_of = dict(zip(live, outputs))
    results: list[GenResult | Exception] = []
    for i, c in enumerate(calls):
        if i not in done:
            if isinstance(prompts[i], Exception):  # that call alone fails; the engine never sees it
                worker.prompts.pending.pop(c.call_id, None)
                done[i] = prompts[i]
            else:
                done[i] = result_of(worker, c, prompts[i], output_of[i], versions)
        results.append(done[i])
    return results


def result_of(worker, c: GenCall, p: list[int], o, versions: dict) -> GenResult | Exception:
    """One call's engine output made its result, the sample kept for training."""
    if isinstance(o, Exception):  # the engine refused this call alone
        worker.prompts.pending.pop(c.call_id, None)
        return o
    worker.prompts.remember(c.call_id, p, o.completion_ids)
    version = versions.get(c.policy, 0)
    if c.record and worker.host.policies[c.policy].trainable:
        sample = Sample(c.call_id, c.policy, p, o.completion_ids, o.logprobs, c.sampling.temperature,
                        dict(c.key), version=version)
        with worker._buffer_lock:
            worker.buffer[c.call_id] = sample
    return GenResult(c.call_id, o.text, len(p), len(o.completion_ids), o.finish_reason, version,
                     logprobs=None if c.logprobs is None else call_logprobs(worker, c, p, o))


def call_logprobs(worker, c: GenCall, prompt: list[int], o) -> list[dict]:
    """``c``'s token logprobs (``worker.logprobs``), over the weights that sampled: the engine's copy
    when it has one, read between publishes."""
    model = worker.copy.model if worker.copy is not None else worker.host.model
    with worker._engine_lock:
        return token_logprobs(worker.host.tokenizer, o, c.logprobs, model=model, prompt=prompt,
                              temperature=c.sampling.temperature, adapter=worker.host.adapter_for(c.policy),
                              lora=worker.host.is_lora)
