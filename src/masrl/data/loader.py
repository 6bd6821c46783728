"""Load tasks from JSONL or Parquet, flat rows or verl's layout (``data.fields`` has the aliases).

question: question | query | problem | prompt (text, or a chat list's last user message) | extra_info.question
answer:   answer | ground_truth | target | solution | reward_model.ground_truth | extra_info.answer
          (GSM8K "####" and \\boxed{} are unwrapped)
id:       uid | id | task_id | idx | extra_info.index   (default: file name and row number)
``data_source`` and ``ability`` are kept in the task's meta (held-out metrics are reported per source).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable

from masrl.data import fields
from masrl.data.answers import extract_gold
from masrl.data.tasks import Task
from masrl.errors import DataError

RowTask = Callable[[dict, Any, int], Task]  # (row, where it came from, its index) -> Task


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl/.json-lines or .parquet file, as dicts."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"dataset file '{path}' does not exist")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    rows = []
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = raw[: exc.start].count(b"\n") + 1
        raise DataError(f"{path}:{lineno}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                        f"re-save the file as UTF-8") from None
    for lineno, line in enumerate(text.split("\n"), 1):  # JSON's own line rule: U+2028 and U+0085 are text
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


def where_of(path, row: dict, i: int) -> str:
    return f"{path}:{row['__line__']}" if "__line__" in row else f"{path} row {i}"


def task_id(row: dict, path, i: int) -> str:
    _, tid = fields.first(row, fields.ID)
    return str(tid) if tid is not None else f"{Path(path).stem}-{i}"


def source_meta(row: dict) -> dict:
    return {k: row[k] for k in ("data_source", "ability") if row.get(k) is not None}


def gold_of(value: Any):
    """The gold answer: a string (GSM8K's "####" and \\boxed{} unwrapped), or a list of acceptable
    answers (Search-R1 writes ``{"target": [...]}``)."""
    if isinstance(value, dict) and "target" in value:
        value = value["target"]
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        golds = [extract_gold(str(v)) for v in value]
        return golds[0] if len(golds) == 1 else golds
    return extract_gold(str(value))


def tasks_from_rows(rows: Iterable[dict], origin: str | Path, row_task: RowTask, n: int | None = None) -> list[Task]:
    """The one row loop of every task source: each row read by ``row_task`` (which names the row
    and the fix when it cannot), the first ``n`` kept; a source with no rows is an error."""
    tasks = []
    for i, row in enumerate(rows):
        tasks.append(row_task(row, origin, i))
        if n is not None and len(tasks) >= n:
            break
    if not tasks:
        raise DataError(f"{origin}: no rows (a dataset file with no lines, or a source that returned none)")
    return tasks


def math_task(row: dict, origin: str | Path, i: int) -> Task:
    """A math row: a question and a gold answer (any of the ``fields`` aliases)."""
    where = where_of(origin, row, i)
    qkey, q = fields.question_of(row)
    akey, a = fields.first(row, fields.ANSWER)
    if q is None:
        raise DataError(f"{where}: no question; give one of the fields {', '.join(fields.QUESTION)}")
    if a is None:
        raise DataError(f"{where}: no answer; give one of the fields {', '.join(fields.ANSWER)}")
    meta = {k: v for k, v in row.items() if k not in (qkey, akey, "__line__") and "." not in str(k)}
    meta.update(source_meta(row))
    return Task(id=task_id(row, origin, i), question=str(q), answer=gold_of(a), meta=meta)


def load_math_tasks(path: str | Path, n: int | None = None) -> list[Task]:
    return tasks_from_rows(read_rows(path), path, math_task, n)
