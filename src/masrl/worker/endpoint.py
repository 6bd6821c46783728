"""A frozen policy served by an OpenAI-compatible endpoint (``policies.X.engine: {kind: openai}``).

Any server with ``POST {base_url}/chat/completions`` (vLLM, llama.cpp's server, SGLang, a hosted
API) can play agents that do not train. ``EndpointHost`` is a ``PolicyHost`` whose policy is
frozen: generating is all it does (no kept calls, no update, nothing to save), and the rest of
the interface answers accordingly. Each call is one HTTP request, at most ``max_concurrency`` in
flight per policy, each with ``timeout_s``; connection errors, timeouts, 429 and 5xx responses are
retried ``retries`` times with exponential backoff (``backoff_s``, doubled each time). A call that
still fails comes back as an ``InfraError`` for that call alone: its trace is dropped from
training and counted as failed, like an engine crash, and never scored as a wrong answer.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from masrl.errors import InfraError, MasrlError
from masrl.messages import GenCall, GenResult
from masrl.web.client import auth_headers, post_chat
from masrl.worker.interface import PolicyHost


class EndpointHost(PolicyHost):
    separate_process = False  # its requests run in the driver's threads

    def __init__(self, spec, engine):
        self.spec, self.cfg = spec, engine
        self.name = f"endpoint-{spec.name}"
        self.specs = {spec.name: spec}
        self.policy_names = [spec.name]
        self.trainable_names: list[str] = []
        self.url = engine.base_url.rstrip("/") + "/chat/completions"
        self.headers = auth_headers(engine.api_key_env, f"policies.{spec.name}.engine")
        self.pool = ThreadPoolExecutor(engine.max_concurrency, thread_name_prefix=f"openai-{spec.name}")
        self.stats = {"requests": 0, "retries": 0, "failures": 0}

    # -- generating ----------------------------------------------------------------------------
    def generate(self, calls: list[GenCall], on_result=None) -> list:  # (answers come back whole)
        return list(self.pool.map(self._one, calls))

    def _body(self, c: GenCall) -> dict:
        s = c.sampling
        body = {"model": self.cfg.model, "messages": c.messages, "temperature": s.temperature, "top_p": s.top_p,
                "max_tokens": s.max_new_tokens, "n": 1}
        if s.stop:
            body["stop"] = list(s.stop)
        if c.seed is not None:
            body["seed"] = int(c.seed) % (2**31)
        if c.tools:
            body["tools"] = [{"type": "function", "function": t} for t in c.tools]
        return body

    def _one(self, c: GenCall):
        try:
            out = post_chat(self.url, self.headers, self._body(c), timeout_s=self.cfg.timeout_s, retries=self.cfg.retries,
                            backoff_s=self.cfg.backoff_s, stats=self.stats)
            choice = out["choices"][0]
            usage = out.get("usage") or {}
            return GenResult(c.call_id, choice["message"].get("content") or "", int(usage.get("prompt_tokens", 0)),
                             int(usage.get("completion_tokens", 0)),
                             "length" if choice.get("finish_reason") == "length" else "stop")
        except InfraError as exc:
            return InfraError(f"policy '{self.spec.name}' at {exc}")
        except (KeyError, IndexError, TypeError) as exc:
            self.stats["failures"] += 1
            return InfraError(f"policy '{self.spec.name}' at {self.url}: unreadable response ({type(exc).__name__}: {exc})")

    # -- the rest of the interface: a frozen policy has nothing to keep, train or save ------------
    def get_tokenizer(self):
        return None  # the server tokenizes

    def commit_rewards(self, rewards) -> int:
        return 0

    def drop(self, call_ids) -> int:
        return 0

    def train_step(self, shared=None, keep_pending=False) -> dict:
        return {}

    def advantages(self) -> dict:
        return {}

    def rewarded(self, policies) -> list:
        return []

    def score(self, policy, samples) -> list:
        raise MasrlError(f"policy '{self.spec.name}' is served by {self.cfg.base_url}: an endpoint gives no logprobs "
                         f"of given tokens (train.policy_kl covers trainable policies only)")

    def get_step(self) -> int:
        return 0

    def park(self) -> None:
        return None

    def begin_eval(self) -> None:
        return None

    def end_eval(self) -> None:
        return None

    def save(self, directory, *, weights_only=False) -> None:
        return None

    def load(self, directory, *, with_optimizer=True) -> None:
        return None

    def load_weights(self, policy, directory) -> None:
        raise MasrlError(f"policy '{policy}' is served by {self.cfg.base_url}: masrl cannot give it weights "
                         f"(an opponent pool's snapshots are policies masrl hosts)")

    def fingerprint(self, policy) -> list[float]:
        return []

    def build_critic(self, policy, name, model, optim, seed) -> None:
        raise MasrlError(f"policy '{policy}' is served by {self.cfg.base_url} and frozen: it has no critic")

    def where(self) -> list[dict]:
        return [{"name": self.name, "pid": os.getpid(), "url": self.url}]

    def take_traffic(self) -> dict:
        return {}

    def take_memory(self) -> list[dict]:
        return []  # its memory is the server's

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
