"""QA tasks from files: a JSONL/Parquet loader (the seeded QA world is ``families/qa/world.py``).

A QA task's ``answer`` is the list of acceptable answers (scored by token F1 / exact match, the
max over them); ``meta`` carries what the search and RAG workflows need:

``supporting``  ids of the documents that hold the facts (the searcher's hit rate is judged on them)
``type``        one_hop | two_hop | comparison (the QA world), or the file's ``type``/``level``
``bridge``      the entity a two-hop question passes through, when known
``context``     supporting passages given inline (a file row's ``context``), for retrieval-free use

File rows: question under any of ``fields.QUESTION``; answers under ``answers`` (a list) or any of
``fields.ANSWER`` (a string or a list); supporting facts under ``supporting`` / ``supporting_facts``
/ ``supporting_ids`` (a list of document ids, or HotpotQA's ``[[title, sentence], ...]``).
"""

from __future__ import annotations

from pathlib import Path

from masrl.data import fields
from masrl.data.loader import read_rows, source_meta, task_id, tasks_from_rows, where_of
from masrl.data.tasks import Task
from masrl.errors import DataError

ANSWERS = ("answers", "golden_answers", *fields.ANSWER)
SUPPORTING = ("supporting", "supporting_facts", "supporting_ids", "extra_info.supporting")


def _answers(value) -> list[str]:
    if isinstance(value, dict) and "target" in value:
        value = value["target"]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value if str(v).strip()]
    return [str(value)]


def _supporting(value) -> list[str]:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict) and "title" in value:  # HotpotQA parquet: {"title": [...], "sent_id": [...]}
        value = list(value["title"])
    out = []
    for v in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(v, (list, tuple)) and v:  # HotpotQA: [title, sentence index]
            v = v[0]
        if str(v) not in out:
            out.append(str(v))
    return out


def qa_task(row: dict, path: str | Path, i: int) -> Task:
    """One QA row as a task; a bad row is a DataError naming the file, the row and the fix."""
    where = where_of(path, row, i)
    qkey, q = fields.question_of(row)
    if q is None:
        raise DataError(f"{where}: no question; give one of the fields {', '.join(fields.QUESTION)}")
    akey, a = fields.first(row, ANSWERS)
    if a is None:
        raise DataError(f"{where}: no answer; give `answers` (a list of acceptable answers) or one of "
                        f"{', '.join(fields.ANSWER)}")
    golds = _answers(a)
    if not golds:
        raise DataError(f"{where}: field '{akey}' holds no non-empty answer")
    meta = source_meta(row)
    skey, sup = fields.first(row, SUPPORTING)
    if sup is not None:
        meta["supporting"] = _supporting(sup)
    for k in ("type", "kind", "level", "bridge", "context"):
        if row.get(k) is not None:
            meta[k] = row[k]
    if "context" in meta and not isinstance(meta["context"], (str, list)):
        raise DataError(f"{where}: field 'context' must be text or a list of passages")
    return Task(task_id(row, path, i), str(q), golds, meta)


def load_qa_tasks(path: str | Path, n: int | None = None) -> list[Task]:
    return tasks_from_rows(read_rows(path), path, qa_task, n)
