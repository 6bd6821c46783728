"""BM25 retrieval: an index over a JSONL corpus, an HTTP server, a failover client, a local retriever."""

from masrl.tools.retrieval.client import LocalRetriever, RetrievalError, RetrieverClient
from masrl.tools.retrieval.index import BM25Index

__all__ = ["BM25Index", "LocalRetriever", "RetrievalError", "RetrieverClient"]
