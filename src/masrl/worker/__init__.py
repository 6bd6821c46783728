"""The worker side: hosts of policies (a model in memory and the policies on it).

``interface.PolicyHost`` is the one interface the driver sees. ``policy_worker.PolicyWorker``
implements it over a model (``hosting``), an engine (``masrl.engines``), training
(``training``, ``batching``, ``precision``), offload, critics and data-parallel ranks;
``endpoint.EndpointHost`` over an OpenAI-compatible server. This ``__init__`` imports nothing,
so the interface stays importable without torch.
"""
