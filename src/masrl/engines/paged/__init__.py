"""The paged engine (``rollout.engine: paged``, the default on CUDA), read top to bottom:

* ``engine.py``: ``PagedEngine``, the Engine a worker calls: calls in, steps run (one thread at a time, others'
  calls joining), weight changes between steps, results out;
* ``scheduler.py``: which calls run in the next step (prefill or decode), pre-emption when the pool is dry;
* ``blocks.py``: the KV block pool, its prefix cache, and the pool's tensors sized from the memory budget;
* ``runner.py``: ``ModelRunner``, everything on the device: weights, pool, step buffers, prefill, decode, CUDA
  graphs, attention;
* ``prefill.py``: the lean-forward prefill over the pool (long prompts, chunked);
* ``calls.py``: a call's host-side state: its random numbers, tokens kept, stop rules, results;
* ``weights.py``: the fused weight copies with every LoRA adapter's columns, and the graph buckets;
* ``kernels/``: the fused Triton ops, each with its torch reference and start-up check.
"""

from masrl.engines.paged.engine import PagedEngine
from masrl.engines.paged.runner import PagedOptions

__all__ = ["PagedEngine", "PagedOptions"]
