"""Seeds that do not depend on batching, processes or devices (no torch here).

Every sampled token is drawn with a uniform number that depends only on its call's seed and its
position: the call's seed derives from the run's seed, the rollout (training step or eval), the
task, the sample, the agent and the turn. So the same config and seed sample the same tokens run
to run, on any device, after a resume, and whichever calls the batcher happens to group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy

_GOLDEN, _M1, _M2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def counter_uniforms(seeds: list[int], n: int) -> numpy.ndarray:
    """``[len(seeds), n]`` uniforms in [0, 1): entry ``[r, t]`` depends only on ``seeds[r]`` and ``t``
    (splitmix64 of the pair, in numpy's wrapping uint64 arithmetic).

    A call's token ``t`` is drawn with ``[seed, t]`` whatever batch it lands in, on any device, so a
    seed gives the same samples run to run and after a resume, however the batcher groups calls."""
    import numpy as np

    with np.errstate(over="ignore"):
        s = np.asarray([x & 0xFFFFFFFFFFFFFFFF for x in seeds], dtype=np.uint64)[:, None]
        t = np.arange(1, n + 1, dtype=np.uint64)[None, :]
        z = s + t * np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def stable_seed(*parts) -> int:
    """A 64-bit seed from any printable parts, the same in every process (unlike ``hash``)."""
    import hashlib

    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "little")
