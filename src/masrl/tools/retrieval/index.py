"""A BM25 index (bm25s) over a JSONL corpus of ``{id, title?, text}``, saved beside the corpus.

The index lives in ``<corpus>.bm25/`` and records the corpus's size and modification time; a
changed corpus is re-indexed on the next load. Documents are returned as ``{"id", "contents"}``
with ``contents = title + "\\n" + text`` (the shape search-agent RL retrievers use).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from pathlib import Path

import numpy as np

from masrl.data.loader import read_rows
from masrl.errors import DataError

INDEX_VERSION = 1

# bm25s imports JAX when it is installed and warms it up at import; on a GPU host JAX then takes
# 75% of a GPU's memory in every process that searches (about 105 GiB of an H200), and the
# policies on that GPU run out of memory. A retriever has no use for a GPU: unless the user chose
# a JAX platform, JAX stays on the CPU (set before bm25s, hence JAX, is first imported).
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def read_corpus(path: str | Path) -> tuple[list[str], list[str]]:
    """(ids, contents) of a JSONL corpus; errors name the line and the field."""
    ids, contents = [], []
    seen = set()
    for row in read_rows(path):
        where = f"{path}:{row.get('__line__')}"
        if "id" not in row:
            raise DataError(f"{where}: missing field 'id'")
        text = row.get("text", row.get("contents"))
        if not isinstance(text, str):
            raise DataError(f"{where}: field 'text' must be a string")
        doc_id = str(row["id"])
        if doc_id in seen:
            raise DataError(f"{where}: duplicate id {doc_id!r}")
        seen.add(doc_id)
        title = row.get("title")
        ids.append(doc_id)
        contents.append(f"{title}\n{text}" if title else text)
    if not ids:
        raise DataError(f"corpus file '{path}' has no documents")
    return ids, contents


def _tokenize(texts: list[str], *, ids: bool):
    import bm25s

    return bm25s.tokenize(texts, stopwords="en", return_ids=ids, show_progress=False)


class BM25Index:
    def __init__(self, retriever, ids: list[str], contents: list[str]):
        self.retriever = retriever
        self.ids = ids
        self.contents = contents
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.ids)

    @staticmethod
    def index_dir(corpus: str | Path) -> Path:
        return Path(str(corpus) + ".bm25")

    @classmethod
    def build(cls, corpus: str | Path) -> "BM25Index":
        import bm25s

        ids, contents = read_corpus(corpus)
        retriever = bm25s.BM25()
        retriever.index(_tokenize(contents, ids=True), show_progress=False)
        index = cls(retriever, ids, contents)
        index.save(corpus)
        return index

    @staticmethod
    def _stamp(corpus: str | Path) -> dict:
        """What an index records of the corpus it was built from (a changed corpus is re-indexed)."""
        st = os.stat(corpus)
        return {"version": INDEX_VERSION, "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    @classmethod
    def is_current(cls, corpus: str | Path) -> bool:
        """Whether a saved index exists for this corpus as it is now."""
        meta_path = cls.index_dir(corpus) / "masrl.json"
        if not (meta_path.is_file() and Path(corpus).is_file()):
            return False
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            return False
        stamp = cls._stamp(corpus)
        return {k: meta.get(k) for k in stamp} == stamp

    def save(self, corpus: str | Path) -> None:
        """Write the index beside the corpus. Runs side by side on one machine share the cache and may
        build the same index at once: each writes its own temporary folder and renames it into place
        (a reader sees a whole index or none), and a current index another process saved is kept."""
        target = self.index_dir(corpus)
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        try:
            self.retriever.save(str(tmp), show_progress=False)
            (tmp / "masrl.json").write_text(json.dumps({**self._stamp(corpus), "documents": len(self.ids)}))
            if self.is_current(corpus):  # another process saved this corpus's index meanwhile
                return
            if target.exists():  # stale: moved aside, then dropped
                aside = Path(tempfile.mkdtemp(prefix=target.name + ".old-", dir=target.parent))
                os.replace(target, aside / "index")
                shutil.rmtree(aside, ignore_errors=True)
            try:
                os.replace(tmp, target)
            except OSError:  # another process renamed its index into place between our two renames
                if not self.is_current(corpus):
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @classmethod
    def load(cls, corpus: str | Path) -> "BM25Index":
        """Load the saved index, or build (and save) it if missing or stale."""
        import bm25s

        if cls.is_current(corpus):
            ids, contents = read_corpus(corpus)
            retriever = bm25s.BM25.load(str(cls.index_dir(corpus)), show_progress=False)
            return cls(retriever, ids, contents)
        return cls.build(corpus)

    def search(self, queries: list[str], topk: int = 3, threads: int = 1) -> list[list[tuple[int, float]]]:
        """Per query, the top ``topk`` (document index, score), best first. ``threads``: score up to
        that many queries of the batch in parallel (bm25s' numba backend)."""
        k = min(topk, len(self.ids))
        tokens = _tokenize(queries, ids=False)
        n_threads = max(1, min(threads, len(queries)))
        with self._lock:  # bm25s keeps per-call state on the retriever
            docs, scores = self.retriever.retrieve(tokens, k=k, show_progress=False, n_threads=n_threads)
        out = []
        for row_d, row_s in zip(np.asarray(docs), np.asarray(scores)):
            out.append([(int(d), float(s)) for d, s in zip(row_d, row_s)])
        return out

    def retrieve(self, queries: list[str], topk: int = 3, return_scores: bool = True, threads: int = 1) -> list[list[dict]]:
        result = []
        for hits in self.search(queries, topk, threads):
            docs = []
            for d, s in hits:
                doc = {"id": self.ids[d], "contents": self.contents[d]}
                if return_scores:
                    doc["score"] = s
                docs.append(doc)
            result.append(docs)
        return result
