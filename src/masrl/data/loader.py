"""Load tasks from JSONL or Parquet with field aliases.

question: question | problem | query | prompt
answer:   answer | ground_truth | target | solution   (GSM8K "####" and \\boxed{} are unwrapped)
id:       id | task_id | idx   (default: file name and row number)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from masrl.data.answers import extract_gold
from masrl.data.tasks import Task
from masrl.errors import DataError

QUESTION_KEYS = ("question", "problem", "query", "prompt")
ANSWER_KEYS = ("answer", "ground_truth", "target", "solution")
ID_KEYS = ("id", "task_id", "idx")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.json-lines or .parquet file, as dicts."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"dataset file '{path}' does not exist")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    rows = []
    with p.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg}); each line must be one JSON object") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            row["__line__"] = lineno
            rows.append(row)
    return rows


def pick(row: dict, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if k in row and row[k] is not None and str(row[k]).strip() != "":
            return row[k]
    return None


def load_math_tasks(path: str | Path, n: int | None = None) -> list[Task]:
    rows = read_rows(path)
    tasks = []
    name = Path(path).stem
    for i, row in enumerate(rows):
        where = f"{path}:{row.get('__line__', i + 1)}" if "__line__" in row else f"{path} row {i}"
        q = pick(row, QUESTION_KEYS)
        a = pick(row, ANSWER_KEYS)
        if q is None:
            raise DataError(f"{where}: no question; give one of the fields {', '.join(QUESTION_KEYS)}")
        if a is None:
            raise DataError(f"{where}: no answer; give one of the fields {', '.join(ANSWER_KEYS)}")
        tid = pick(row, ID_KEYS)
        meta = {k: v for k, v in row.items() if k not in QUESTION_KEYS + ANSWER_KEYS + ID_KEYS and k != "__line__"}
        tasks.append(Task(id=str(tid) if tid is not None else f"{name}-{i}", question=str(q), answer=extract_gold(str(a)), meta=meta))
        if n is not None and len(tasks) >= n:
            break
    if not tasks:
        raise DataError(f"dataset file '{path}' has no rows")
    return tasks
