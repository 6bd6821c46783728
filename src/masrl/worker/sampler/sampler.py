"""The sampling wing of a worker: its engine, prompt rendering and the buffer of the calls it served.

``Sampler.generate`` checks, renders and tokenises each call on its own, so one bad prompt fails its own
call (a ``PromptError`` in its place) and the others run as one engine batch. Each result records the
version of the weights its call started on; a trainable policy's call that asked to be recorded is
buffered as a ``Sample`` (exact token ids and sampling logprobs) for the update. ``publish`` hands new
weights to the engine and refuses to go on when the engine did not take them.
"""

from __future__ import annotations

import contextlib
import threading

from masrl.engines.base import Engine
from masrl.messages import GenCall, GenRequest, GenResult
from masrl.worker.model.held import HeldModel
from masrl.worker.sampler.logprobs import token_logprobs
from masrl.worker.sampler.prompts import PromptRenderer
from masrl.worker.updater.batching import Sample


class Sampler:
    def __init__(self, held: HeldModel, engine: Engine, copy=None, *, overlaps_update: bool = False,
                 fsdp: bool = False, versions: dict[str, int] | None = None):
        """``copy``: the weights the engine samples from when they are not the live ones (``WeightCopy``,
        ``EngineWeights``); ``versions``: the version each policy's weights start at."""
        self.held = held
        self.engine = engine
        self.copy = copy
        self.prompts = PromptRenderer(held.tokenizer)  # remembers recent turns, to continue a conversation exactly
        self.lock = copy.lock if copy else contextlib.nullcontext()  # held by a batch, and by a publish
        # a paged engine under overlap_update takes new weights between two steps, mid-call (at_boundary):
        # its batches then hold no lock, and a publish never waits for the longest running call
        self.swaps_mid_call = overlaps_update and not fsdp and engine.swaps_between_steps
        self.joins_batches = engine.joins_running_decode
        self.buffer: dict[str, Sample] = {}
        self.buffer_lock = threading.Lock()
        self.published = dict(versions or {})  # the version of the weights the engine samples from, per policy

    # -- calls ---------------------------------------------------------------------------------
    def render(self, messages: list[dict], template_kwargs: dict | None = None, tools: list[dict] | None = None,
               extends: str | None = None, call_id: str | None = None) -> list[int]:
        """Prompt token ids (``sampler.prompts``); ``extends``: the call these messages continue;
        ``call_id``: the call this prompt is for (remembered once its completion is known)."""
        text, ids = self.prompts.render(messages, template_kwargs, tools, extends)
        if call_id is not None:
            self.prompts.pending[call_id] = text
        return ids

    def context_limit(self) -> int:
        """The most tokens a prompt and its completion may hold (the model's position limit)."""
        return int(getattr(self.held.core.config, "max_position_embeddings", None) or 1 << 30)

    def generate(self, calls: list[GenCall], on_result=None) -> list[GenResult | Exception]:
        """``on_result(i, result)``, for an engine that joins batches (``joins_batches``): told of call
        ``i`` as soon as it finishes, before the batch's last call does (calls that ask for ``logprobs``
        are scored after the batch, and told then)."""
        prompts = self.prompts.prepare(calls, self.context_limit())
        live = [i for i, p in enumerate(prompts) if not isinstance(p, Exception)]
        requests = [GenRequest(prompts[i], calls[i].sampling, adapter=self.held.adapter_for(calls[i].policy),
                               seed=calls[i].seed) for i in live]
        done: dict[int, GenResult | Exception] = {}
        versions: dict[str, int] = {}
        early = None
        if on_result is not None and self.joins_batches:
            def early(j, o):  # from the engine's stepping thread, between two steps
                i = live[j]
                if calls[i].logprobs is None:
                    done[i] = self._result(calls[i], prompts[i], o, versions)
                    on_result(i, done[i])
        # each call's version: the weights it started on (with swaps_mid_call later tokens may be newer;
        # without, a publish waits for this batch, so they are the batch's weights throughout)
        with contextlib.nullcontext() if self.swaps_mid_call else self.lock:
            versions.update(self.published)
            outputs = []
            if requests:
                outputs = self.engine.generate(requests, early)
        output_of = dict(zip(live, outputs))
        results: list[GenResult | Exception] = []
        for i, c in enumerate(calls):
            if i not in done:
                if isinstance(prompts[i], Exception):  # that call alone fails; the engine never sees it
                    self.prompts.pending.pop(c.call_id, None)
                    done[i] = prompts[i]
                else:
                    done[i] = self._result(c, prompts[i], output_of[i], versions)
            results.append(done[i])
        return results

    def _result(self, c: GenCall, p: list[int], o, versions: dict) -> GenResult | Exception:
        """One call's engine output made its result, the sample kept for training."""
        if isinstance(o, Exception):  # the engine refused this call alone
            self.prompts.pending.pop(c.call_id, None)
            return o
        self.prompts.remember(c.call_id, p, o.completion_ids)
        version = versions.get(c.policy, 0)
        if c.record and self.held.policies[c.policy].trainable:
            sample = Sample(c.call_id, c.policy, p, o.completion_ids, o.logprobs, c.sampling.temperature,
                            dict(c.key), version=version)
            with self.buffer_lock:
                self.buffer[c.call_id] = sample
        return GenResult(c.call_id, o.text, len(p), len(o.completion_ids), o.finish_reason, version,
                         logprobs=None if c.logprobs is None else self._logprobs(c, p, o))

    def _logprobs(self, c: GenCall, prompt: list[int], o) -> list[dict]:
        """``c``'s token logprobs (``sampler.logprobs``), over the weights that sampled: the engine's copy
        when it has one, read between publishes."""
        model = self.copy.model if self.copy is not None else self.held.model
        with self.lock:
            return token_logprobs(self.held.tokenizer, o, c.logprobs, model=model, prompt=prompt,
                                  temperature=c.sampling.temperature, adapter=self.held.adapter_for(c.policy),
                                  lora=self.held.is_lora)

    # -- the buffer ----------------------------------------------------------------------------
    def commit_rewards(self, rewards: dict[str, float]) -> int:
        """Attach rewards to buffered calls; returns how many matched."""
        n = 0
        for call_id, r in rewards.items():
            s = self.buffer.get(call_id)
            if s is not None:
                s.reward = float(r)
                n += 1
        return n

    def drop(self, call_ids: list[str]) -> int:
        with self.buffer_lock:
            return sum(self.buffer.pop(c, None) is not None for c in call_ids)

    def rewarded(self, policies: list[str]) -> list[Sample]:
        """The buffered calls of ``policies`` that have a reward."""
        return [s for s in self.buffer.values() if s.policy in policies and s.reward is not None]

    def view(self) -> dict[str, Sample]:
        """The buffer as it is now (calls that arrive later, during an update, are not in it)."""
        with self.buffer_lock:
            return dict(self.buffer)

    def forget(self, call_ids: list[str]) -> None:
        with self.buffer_lock:
            for k in call_ids:
                self.buffer.pop(k, None)

    # -- weights -------------------------------------------------------------------------------
    def publish(self, policies: list[str] | None, versions: dict[str, int]) -> None:
        """The engine samples the live weights of ``policies`` (None: all of ``versions``) from its next
        batch on (``swaps_mid_call``: from its next step on, running calls included); ``versions``: each
        policy's update count, the version its calls carry from then on."""
        named = policies if policies is not None else list(versions)

        def swap():
            with self.lock:
                if self.copy:
                    self.copy.publish(policies)
                self.engine.weights_updated(policies)
                stale = self.engine.stale_weights()
                if stale:  # it would go on sampling the old policy under the new version's name
                    raise RuntimeError(f"the rollout engine did not take the new weights of {', '.join(named)} "
                                       f"(still the old: {', '.join(stale[:4])}{' ...' if len(stale) > 4 else ''});"
                                       f" stopping rather than training on calls sampled from the old policy")
                for p in named:
                    if p in versions:
                        self.published[p] = versions[p]

        if self.swaps_mid_call:
            self.engine.at_boundary(swap)
        else:
            swap()
