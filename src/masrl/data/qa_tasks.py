"""QA tasks: the seeded QA world (corpus + questions) and a JSONL/Parquet loader.

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

import os
import random
import tempfile
from pathlib import Path

from masrl.data import fields
from masrl.data.cache import cache_dir
from masrl.data.loader import read_rows, source_meta, task_id, tasks_from_rows, where_of
from masrl.data.tasks import Task
from masrl.errors import DataError

ANSWERS = ("answers", "golden_answers", *fields.ANSWER)
SUPPORTING = ("supporting", "supporting_facts", "supporting_ids", "extra_info.supporting")


def world_dir(docs: int, seed: int, root: str | None = None) -> Path:
    base = Path(root).expanduser() if root else cache_dir() / "qa_world"
    return base / f"docs{docs}-seed{seed}"


def ensure_world(docs: int, seed: int, root: str | None = None) -> Path:
    """Write the world's ``corpus.jsonl`` (and the full question pool) once; return its folder.
    Written to a temporary folder and renamed, so two processes never see half a corpus."""
    from masrl.data.qa_world import write_world

    out = world_dir(docs, seed, root)
    if (out / "corpus.jsonl").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    write_world(tmp, docs, 0, seed=seed)
    try:
        os.replace(tmp, out)
    except OSError:  # another process won the race; its copy is identical
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out


def world_tasks(n: int, *, seed: int, world_docs: int, world_seed: int, levels: list[int] = (1, 2, 3),
                exclude: set[str] | None = None, context_docs: int = 0) -> list[Task]:
    """``n`` questions about the world (``world_docs``, ``world_seed``), drawn with ``seed``: train
    and held-out sets use different seeds over the same world (and corpus). ``levels``: 1 one-hop,
    2 two-hop, 3 comparison, in equal shares. ``context_docs`` > 0: each question also carries that
    many passages in ``meta.context`` (its supporting documents among same-kind distractors, drawn
    from the question's text, so a question's passages never depend on which split holds it)."""
    from masrl.data.qa_world import build_world, documents, questions, reading_context

    w = build_world(world_docs, seed=world_seed)
    docs = documents(w, seed=world_seed) if context_docs else []
    extra = len(exclude or ())
    mix = tuple(1.0 if lvl in levels else 0.0 for lvl in (1, 2, 3))
    pool = questions(w, n + extra, seed=seed * 7919 + world_seed, mix=mix)
    tasks = []
    for q in pool:
        if exclude and q["question"] in exclude:
            continue
        meta = {"supporting": list(q["supporting"]), "type": q["type"], "kind": q["kind"], "data_source": "qa_world"}
        if q.get("bridge"):
            meta["bridge"] = q["bridge"]
        if context_docs:
            rng = random.Random(f"context-{world_seed}-{q['question']}")
            meta["context"] = reading_context(docs, list(q["supporting"]), context_docs, rng)
        tasks.append(Task(f"qa-{seed}-{len(tasks)}", q["question"], list(q["answers"]), meta))
        if len(tasks) >= n:
            break
    return tasks


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
