"""The worker side: hosts of policies (a model in memory and the policies on it).

``interface.PolicyHost`` is the one interface the driver sees. ``policy_worker.PolicyWorker``
implements it by delegating to four wings: ``model/`` (the held weights and their copies, offload,
checkpoint files, memory), ``sampler/`` (the engine, prompts, the buffer of served calls), ``updater/``
(optimizers, advantages, the PPO update, critics, EMA) and ``parallel/`` (data parallel, FSDP2);
``endpoint.EndpointHost`` implements it over an OpenAI-compatible server. This ``__init__`` imports
nothing, so the interface stays importable without torch.
"""
