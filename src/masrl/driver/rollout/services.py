"""What workflows' tools are built on: the code verifier (sandbox), the retriever and the
OpenAI-compatible gateway, made once per run from config.

A workflow that has tools defines ``tools(services) -> {name: Tool}``; it asks ``services`` for
what it needs, so the sandbox is set up (and its isolation checked against ``sandbox.require``)
only in runs whose workflow runs code, and the corpus is indexed only in runs that search.
"""

from __future__ import annotations

from masrl.config import RetrieverConfig, SandboxConfig, WorldConfig
from masrl.errors import ConfigError


class Services:
    def __init__(self, sandbox: SandboxConfig | None = None, retriever: RetrieverConfig | None = None,
                 world: WorldConfig | None = None):
        self.sandbox_cfg = sandbox or SandboxConfig()
        self.retriever_cfg = retriever or RetrieverConfig()
        self.world_cfg = world or WorldConfig()
        self._verifier = None
        self._retriever = None

    @property
    def tool_timeout_s(self) -> float:
        return self.sandbox_cfg.tool_timeout_s

    @property
    def topk(self) -> int:
        return self.retriever_cfg.topk

    def code_verifier(self):
        if self._verifier is None:
            from masrl.sandbox import Limits, SandboxUnavailable, check_isolation
            from masrl.tools.code_tests import CodeVerifier

            c = self.sandbox_cfg
            try:
                check_isolation(c.require)
            except SandboxUnavailable as exc:
                raise ConfigError(str(exc)) from None
            self._verifier = CodeVerifier(c.max_workers, Limits(cpu_s=c.cpu_s, wall_s=c.wall_s, memory_mb=c.memory_mb))
        return self._verifier

    def retriever(self):
        """The configured retriever: a local BM25 index (by default over the corpus a family provides: the QA
        world's) or HTTP servers with failover. Both answer ``aretrieve(queries, topk)``."""
        if self._retriever is None:
            from masrl.tools.retrieval import LocalRetriever, RetrieverClient

            c = self.retriever_cfg
            if c.kind == "http":
                from masrl.web.client import auth_headers

                key = auth_headers(c.api_key_env, "retriever").get("Authorization", "")[len("Bearer "):] or None
                self._retriever = RetrieverClient(c.endpoints, timeout_s=c.timeout_s, retries=c.retries,
                                                  dead_for_s=c.dead_for_s, api_key=key)
            else:
                self._retriever = LocalRetriever(c.corpus or self._default_corpus())
        return self._retriever

    def _default_corpus(self) -> str:
        from masrl.families import SERVICES

        if "corpus" not in SERVICES:
            raise ConfigError("retriever.corpus: the search tool needs a corpus and no task family provides a "
                              "default one; set retriever.corpus to a JSONL file of {id, title?, text}")
        return SERVICES["corpus"](self.world_cfg)

    def gateway(self, *, port: int = 0, api_key: str | None = None, host: str = "127.0.0.1"):
        """A new OpenAI-compatible gateway (not started) for a workflow whose agents live in an outside
        program (``external``); the workflow starts and stops it."""
        from masrl.driver.serving.gateway import Gateway

        return Gateway(host=host, port=port, api_key=api_key)
