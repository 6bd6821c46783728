"""A frozen policy served by an OpenAI-compatible endpoint (``policies.X.engine: {kind: openai}``).

Any server with ``POST {base_url}/chat/completions`` (vLLM, llama.cpp's server, SGLang, a hosted
API) can play agents that do not train. ``OpenAIWorker`` has the worker interface the controller
uses; generating is all it does (no buffer, no update, nothing to save). Each call is one HTTP
request, at most ``max_concurrency`` in flight per policy, each with ``timeout_s``; connection
errors, timeouts, 429 and 5xx responses are retried ``retries`` times with exponential backoff
(``backoff_s``, doubled each time). A call that still fails comes back as an ``InfraError`` for
that call alone: its trace is dropped from training and counted as failed, like an engine crash,
and never scored as a wrong answer.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

from masrl.messages import GenCall, GenResult
from masrl.runtime.context import InfraError

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def post_chat(url: str, headers: dict, body: dict, *, timeout_s: float, retries: int, backoff_s: float,
              stats: dict | None = None) -> dict:
    """POST one chat completion; retry connection errors, timeouts, 408/409/429/5xx with doubling
    waits. Returns the parsed JSON; raises ``InfraError`` (naming the URL, model and last error)."""
    stats = stats if stats is not None else {}
    for k in ("requests", "retries", "failures"):
        stats.setdefault(k, 0)
    data = json.dumps(body).encode()
    last = ""
    attempt = 0
    for attempt in range(retries + 1):
        if attempt:
            stats["retries"] += 1
            time.sleep(backoff_s * 2 ** (attempt - 1))
        stats["requests"] += 1
        req = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            if exc.code not in RETRY_STATUS:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        except ValueError as exc:
            last = f"unreadable response ({exc})"
            break
    stats["failures"] += 1
    raise InfraError(f"{url} (model {body.get('model')!r}): {last} after {attempt + 1} attempt(s)")


def auth_headers(api_key_env: str | None, where: str) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            from masrl.errors import ConfigError

            raise ConfigError(f"{where}.api_key_env: ${api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    return headers


class OpenAIWorker:
    remote = False

    def __init__(self, spec, engine):
        self.spec, self.cfg = spec, engine
        self.specs = {spec.name: spec}
        self.policy_names = [spec.name]
        self.trainable_names: list[str] = []
        self.tokenizer = None  # the server tokenizes
        self.step = 0
        self.url = engine.base_url.rstrip("/") + "/chat/completions"
        self.headers = auth_headers(engine.api_key_env, f"policies.{spec.name}.engine")
        self.pool = ThreadPoolExecutor(engine.max_concurrency, thread_name_prefix=f"openai-{spec.name}")
        self.stats = {"requests": 0, "retries": 0, "failures": 0}

    # -- generating ----------------------------------------------------------------------------
    def generate(self, calls: list[GenCall]) -> list:
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

    # -- the rest of the worker interface: nothing to train, keep or save ----------------------
    def commit_rewards(self, rewards) -> int:
        return 0

    def drop(self, call_ids) -> int:
        return 0

    def advantages(self) -> dict:
        return {}

    def train_step(self, shared=None) -> dict:
        return {}

    def park(self) -> None:
        return None

    def save(self, directory) -> None:
        return None

    def load(self, directory, *, with_optimizer=True) -> None:
        return None

    def fingerprint(self, policy) -> list[float]:
        return []

    def rewarded(self, policies) -> list:
        return []

    def evaluating(self):
        return nullcontext()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
