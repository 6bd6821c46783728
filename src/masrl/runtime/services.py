"""What workflows' tools are built on: the code verifier (sandbox) today, made once per run from config.

A workflow that has tools defines ``tools(services) -> {name: Tool}``; it asks ``services`` for
what it needs, so the sandbox is set up (and its isolation checked against ``sandbox.require``)
only in runs whose workflow runs code.
"""

from __future__ import annotations

from masrl.config import SandboxConfig
from masrl.errors import ConfigError


class Services:
    def __init__(self, sandbox: SandboxConfig):
        self.sandbox_cfg = sandbox
        self._verifier = None

    @property
    def tool_timeout_s(self) -> float:
        return self.sandbox_cfg.tool_timeout_s

    def code_verifier(self):
        if self._verifier is None:
            from masrl.tools.code_tests import CodeVerifier
            from masrl.tools.sandbox import Limits, SandboxUnavailable, check_isolation

            c = self.sandbox_cfg
            try:
                check_isolation(c.require)
            except SandboxUnavailable as exc:
                raise ConfigError(str(exc)) from None
            self._verifier = CodeVerifier(c.max_workers, Limits(cpu_s=c.cpu_s, wall_s=c.wall_s, memory_mb=c.memory_mb))
        return self._verifier
