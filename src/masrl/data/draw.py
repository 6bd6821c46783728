"""Drawing ``n`` distinct tasks from a seeded generator: the one loop every generator uses."""

from __future__ import annotations

from typing import Callable, Iterable

from masrl.data.tasks import Task

# one attempt: the question it drew, and how to finish the task (called only for a question not seen before,
# so a generator draws the rest of a task's randomness only when it keeps it, as it always has)
Attempt = tuple[str, Callable[[int], Task]]


def draw_distinct(n: int, attempt: Callable[[], Attempt], *, exclude: Iterable[str] = (), max_attempts: int,
                  exhausted: str | None = None) -> list[Task]:
    """``n`` tasks with distinct questions, none in ``exclude``. ``attempt()`` draws one; ``make(k)`` builds the
    ``k``-th task kept. Past ``max_attempts`` the tasks so far are returned, or ``ValueError(exhausted)`` raised
    when ``exhausted`` is given."""
    seen = set(exclude)
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < n:
        if attempts >= max_attempts:
            if exhausted is not None:
                raise ValueError(exhausted)
            break
        attempts += 1
        question, make = attempt()
        if question in seen:
            continue
        seen.add(question)
        tasks.append(make(len(tasks)))
    return tasks
