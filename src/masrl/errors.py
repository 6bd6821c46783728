"""Every exception masrl raises on purpose, by class of failure (DESIGN.md, "failed call").

- ``MasrlError`` and its kinds: bad input (config, data, model, a bug in user code, a lost
  worker). The CLI prints the message alone, without a traceback; it says what, where, and how
  to fix.
- ``InfraError`` and ``ToolError``: an infrastructure failure inside one trace (an engine or an
  endpoint that failed, a call or tool past its timeout). The trace is dropped from training and
  counted; past ``rollout.max_failed_fraction`` of a step the run stops.
"""

from __future__ import annotations


class MasrlError(Exception):
    """A user-facing error. The CLI prints its message alone, without a traceback."""


class ConfigError(MasrlError):
    """A configuration file or override is invalid."""


class DataError(MasrlError):
    """A dataset file or row is invalid."""


class ModelError(MasrlError):
    """A model name or path cannot be resolved or loaded."""


class WorkflowBug(MasrlError):
    """A workflow, parser, scorer or reward raised something that is not an infrastructure failure:
    training on it would hide a bug, so the run stops with the traceback and the task."""


class WorkerLost(MasrlError):
    """A worker hosting policies (a Ray actor) died or could not be reached."""


class InfraError(RuntimeError):
    """An infrastructure failure (timeout, engine crash): the trace is excluded from training."""


class ToolError(InfraError):
    """A tool failed for a reason the model did not cause: the trace is dropped, as for InfraError.
    (A failure the model caused comes back from ``ctx.tool`` as ``ToolResult(ok=False)``.)"""


class PromptError(InfraError):
    """One call's prompt cannot be run: it does not render or tokenise (a lone UTF-16 surrogate,
    say), or it is too long to try. That call fails alone, never its batch; a workflow's episode
    fails with it (dropped and counted, like any infrastructure failure), the gateway answers 400."""


class ContextOverflow(PromptError):
    """A prompt plus the tokens asked for do not fit the model's context (the gateway answers 400)."""

    def __init__(self, tokens: int, max_new: int, limit: int):
        super().__init__(tokens, max_new, limit)  # the args rebuild it when it crosses a process
        self.tokens, self.max_new, self.limit = tokens, max_new, limit

    def __str__(self) -> str:
        return (f"the prompt has {self.tokens} tokens and asks for up to {self.max_new} more, past the model's "
                f"context of {self.limit} tokens")
