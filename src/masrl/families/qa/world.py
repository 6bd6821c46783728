"""The seeded QA world's tasks: its corpus written once to the cache, and questions drawn from it (``source:
qa_world``). The world itself (entities, documents, questions, reading contexts) is ``world_gen.py``.

A task's ``meta`` carries what the search, RAG and reading workflows need: ``supporting`` (ids of the
documents that hold the facts), ``type`` (one_hop | two_hop | comparison), ``kind`` (the question's
template), ``bridge`` (the entity a two-hop question passes through) and, with ``context_docs``,
``context`` (its supporting documents among same-kind distractors).
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path

from masrl.data.cache import cache_dir
from masrl.data.tasks import Task


def world_dir(docs: int, seed: int, root: str | None = None) -> Path:
    base = Path(root).expanduser() if root else cache_dir() / "qa_world"
    return base / f"docs{docs}-seed{seed}"


def ensure_world(docs: int, seed: int, root: str | None = None) -> Path:
    """Write the world's ``corpus.jsonl`` (and the full question pool) once; return its folder.
    Written to a temporary folder and renamed, so two processes never see half a corpus."""
    from masrl.families.qa.world_gen import write_world

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
    from masrl.families.qa.world_gen import build_world, documents, questions, reading_context

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
