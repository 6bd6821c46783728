"""HTTP for the rest of masrl, on the standard library: ``server`` (an asyncio HTTP/1.1 server with read timeouts,
a connection cap, a body cap and JSON errors without internals, which the gateway, the task-environment server and
the retriever run on) and ``client`` (the OpenAI-compatible POST with retries that endpoint hosts and the judge
reward send)."""
