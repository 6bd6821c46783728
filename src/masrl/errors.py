"""The one exception type users see for bad input: it says what, where, and how to fix."""

from __future__ import annotations


class MasrlError(Exception):
    """A user-facing error. The CLI prints its message alone, without a traceback."""


class ConfigError(MasrlError):
    """A configuration file or override is invalid."""


class DataError(MasrlError):
    """A dataset file or row is invalid."""


class ModelError(MasrlError):
    """A model name or path cannot be resolved or loaded."""
