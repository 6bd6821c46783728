"""Tasks: generators, file loaders and answer checking."""

from masrl.data.tasks import Task

__all__ = ["Task"]
