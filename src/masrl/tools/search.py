"""The retrieval tools of the search and RAG workflows, on the run's retriever (``retriever:``).

``search(query)``          one query, the top ``retriever.topk`` documents
``search_many(queries)``   a batch of queries in one retriever request (RAG's sub-queries)

An empty query or one the server rejects (4xx) is the model's mistake (a ``ToolUseError``,
shown to it); every endpoint down is an infrastructure failure (the trace is dropped).
"""

from __future__ import annotations

from masrl.tools.base import Tool, ToolUseError


def search_tools(services) -> dict[str, Tool]:
    from masrl.tools.retrieval.client import RequestRejected

    retrieve = services.retriever().aretrieve  # local or HTTP: both off the event loop
    topk = services.topk

    async def search(query: str) -> list[dict]:
        """Search the document collection; returns the best matching documents."""
        if not query.strip():
            raise ToolUseError("the search query is empty")
        try:
            return (await retrieve([query], topk))[0]
        except RequestRejected as exc:
            raise ToolUseError(str(exc)) from None

    async def search_many(queries: list[str]) -> list[list[dict]]:
        """Search several queries at once; returns the documents of each."""
        qs = [q for q in queries if isinstance(q, str)]
        if not qs or any(not q.strip() for q in qs):
            raise ToolUseError("give at least one query, none empty")
        try:
            return await retrieve(qs, topk)
        except RequestRejected as exc:
            raise ToolUseError(str(exc)) from None

    timeout = services.tool_timeout_s
    return {"search": Tool.from_function(search, timeout_s=timeout),
            "search_many": Tool.from_function(search_many, timeout_s=timeout)}


def show_docs(docs: list[dict], max_chars: int = 400) -> str:
    """Documents as the models see them: ``[1] Title: text`` lines."""
    lines = []
    for i, d in enumerate(docs, 1):
        title, _, text = str(d.get("contents", "")).partition("\n")
        if not text:
            title, text = str(d.get("id", "")), title
        lines.append(f"[{i}] {title}: {' '.join(text.split())[:max_chars]}")
    return "\n".join(lines) if lines else "(no documents)"
