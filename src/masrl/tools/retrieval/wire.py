"""The retrieval wire format: Search-R1's, both directions.

Request:  ``{"queries": [...], "topk": 3, "return_scores": true}``
Response: ``{"result": [per query: [...]]}`` where each entry is, with ``return_scores``,
``{"document": {"id": ..., "contents": ...}, "score": s}``, and without, the document itself
``{"id": ..., "contents": ...}``. ``contents`` is ``title + "\\n" + text`` (clients take the title
from its first line). Inside masrl a retrieved document is flat: ``{"id", "contents"[, "score"]}``.
"""

from __future__ import annotations


def to_wire(results: list[list[dict]], return_scores: bool) -> list[list[dict]]:
    """Flat documents -> Search-R1's response entries."""
    out = []
    for docs in results:
        if return_scores:
            out.append([{"document": {k: v for k, v in d.items() if k != "score"}, "score": d.get("score", 0.0)}
                        for d in docs])
        else:
            out.append([{k: v for k, v in d.items() if k != "score"} for d in docs])
    return out


def from_wire(payload, n_queries: int) -> list[list[dict]]:
    """Any server's answer -> flat documents. Accepts Search-R1's scored and plain entries and flat
    documents with a ``score``; raises ValueError saying what is missing."""
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, list) or len(result) != n_queries:
        raise ValueError(f"response has no 'result' list with one entry per query ({n_queries})")
    out = []
    for qi, docs in enumerate(result):
        if not isinstance(docs, list):
            raise ValueError(f"result[{qi}] is not a list of documents")
        flat = []
        for di, entry in enumerate(docs):
            if isinstance(entry, dict) and isinstance(entry.get("document"), dict):
                doc = dict(entry["document"])
                if "score" in entry:
                    doc["score"] = entry["score"]
            elif isinstance(entry, dict):
                doc = dict(entry)
            else:
                raise ValueError(f"result[{qi}][{di}] is not an object")
            if not isinstance(doc.get("contents"), str):
                raise ValueError(f"result[{qi}][{di}] has no 'contents' (neither at the top nor under 'document')")
            doc.setdefault("id", "")
            flat.append(doc)
        out.append(flat)
    return out
