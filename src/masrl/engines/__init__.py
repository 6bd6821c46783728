"""Rollout engines behind one ``Engine`` protocol (``base``): ``hf`` (eager, any architecture), ``paged``
(``paged/``: continuous batching over a paged KV cache, CUDA graphs and Triton kernels on CUDA; the default there),
``vllm`` (vLLM in the worker's process). Policies served by an OpenAI-compatible endpoint are a kind of host instead
(``worker.endpoint``); the per-host batcher is on the driver side (``driver.batcher``)."""
