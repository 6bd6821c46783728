"""Task: one dataset row."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    id: str
    question: str
    answer: Any  # gold answer (string for math and QA; test spec for code)
    meta: dict[str, Any] = field(default_factory=dict)
