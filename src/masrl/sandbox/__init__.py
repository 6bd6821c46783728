"""The sandbox: model-written Python run in a subprocess with walls around it (``runner``: ``run_python`` and the
``Sandbox`` pool; ``isolation``: which walls this machine allows; ``cgroups``: how memory is bounded; ``zygote``: a
pre-started process per pool slot that forks each run; ``harness``: what runs inside the walls). Nothing here runs
generated code in the caller's process. Its users: the code family's test runner and tools, and ``masrl doctor``."""

from masrl.sandbox.runner import (
    CODE_COMPILE,
    CODE_IMPORT,
    CODE_MEMORY,
    UID_BASE,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    check_isolation,
    isolation,
    run_python,
    slot_uid,
)

__all__ = ["Limits", "RunResult", "Sandbox", "run_python", "isolation", "UID_BASE", "CODE_COMPILE", "CODE_IMPORT",
           "CODE_MEMORY", "SandboxUnavailable", "check_isolation", "slot_uid"]
