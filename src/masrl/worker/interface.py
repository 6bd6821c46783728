"""The one interface between the driver and a host of policies.

A *host* owns one model in memory and the policies on it (``PolicyWorker``), or stands for such
a host elsewhere: a Ray actor (``driver.hosts.RemoteHost``), the ranks of a data-parallel policy
(``driver.hosts.RankedHost``), or a frozen policy served by an OpenAI-compatible endpoint
(``worker.endpoint.EndpointHost``). ``PolicyHost`` names, once, every method the driver may call
on any of them; each is abstract, so a kind of host that lacks one cannot be built.

Everything that crosses is plain picklable data (chat messages, sampling settings, texts,
``{call_id: reward}``, metrics, paths); token ids and logprobs stay in the host that sampled them,
except where an option asks for them (``share_from``, ``train.policy_kl``: ``Sample`` lists).

Each method also says how a data-parallel group runs it (``fan_out``) and how it combines the
ranks' answers, so ``RankedHost`` and the Ray proxy are generated from this table instead of
being written out per method. This module imports no torch.
"""

from __future__ import annotations

import abc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from masrl.messages import GenCall, GenResult
    from masrl.policies import PolicySpec
    from masrl.worker.updater.batching import Sample


@dataclass(frozen=True)
class Method:
    """How a group of data-parallel ranks runs a method.

    ``fan_out``: ``split`` (the calls are shared out among the ranks in contiguous parts), ``all``
    (every rank gets the same arguments), ``first`` (rank 0 answers for all: the ranks hold
    identical weights), ``refuse`` (a data-parallel host cannot; the builder refuses the options
    that would call it). ``combine``: the ranks' answers -> one answer (``all`` and ``split``).
    ``local``: the method is answered by the driver-side handle itself and never crosses.
    """

    name: str
    fan_out: str = "all"
    combine: Callable[[list], Any] | None = None
    local: bool = False


METHODS: dict[str, Method] = {}


def host_method(fan_out: str = "all", combine: Callable[[list], Any] | None = None, local: bool = False):
    """Declare a method of the interface (on ``PolicyHost`` only, over ``abc.abstractmethod``)."""

    def declare(fn):
        METHODS[fn.__name__] = Method(fn.__name__, fan_out, combine, local)
        return fn

    return declare


def _concat(parts: list[list]) -> list:
    return [x for part in parts for x in part]


def _merge(parts: list[dict]) -> dict:
    out: dict = {}
    for p in parts:
        out.update(p)
    return out


def _none(parts: list) -> None:
    return None


RANK_COUNTS = ("n_seqs", "n_tokens", "trained_tokens", "zero_adv_seqs")


def _rank_metrics(parts: list[dict]) -> dict:
    """Every rank takes the same step; per-rank counts add up, the rest is rank 0's."""
    first = parts[0]
    for m in parts[1:]:
        for p, d in m.items():
            for k in RANK_COUNTS:
                if k in d and p in first:
                    first[p][k] += d[k]
    return first


def _traffic(parts: list[dict]) -> dict:
    out: dict[str, list[float]] = {}
    for part in parts:
        for k, v in part.items():
            acc = out.setdefault(k, [0, 0, 0, 0.0])
            for j in range(4):
                acc[j] += v[j]
    return out


class PolicyHost(abc.ABC):
    """What the driver may call on a host of policies. Attributes every host sets at construction:
    ``name``, ``specs`` (policy name -> ``PolicySpec``), ``policy_names``, ``trainable_names``, and
    ``separate_process`` (it runs in another process: the driver updates several such hosts at
    once), ``overlaps_update`` (its engine samples from a copy of the weights, so the driver may
    let it generate while it updates) and ``joins_batches`` (its engine takes a new batch's calls
    into the decode it is running, so the driver may hand it several batches at once). (Not
    ``remote``: Ray's actor classes own that name.)"""

    name: str
    specs: dict[str, PolicySpec]
    policy_names: list[str]
    trainable_names: list[str]
    separate_process: bool = False
    overlaps_update: bool = False
    joins_batches: bool = False

    # -- rollout -------------------------------------------------------------------------------
    @host_method("split", _concat)
    @abc.abstractmethod
    def generate(self, calls: list[GenCall], on_result=None) -> list[GenResult | Exception]:
        """Sample each call; an ``InfraError`` in a call's place fails that call alone. Calls with
        ``record`` on a trainable policy are kept (token ids, logprobs) for the next update.
        ``on_result(i, result)``: a host in the driver's process whose engine joins batches
        (``joins_batches``) tells each call as it finishes, from another thread, before it returns
        the whole list; other hosts ignore it (the driver passes it to no other)."""

    @host_method("first")
    @abc.abstractmethod
    def get_tokenizer(self) -> Any:
        """The tokenizer the host renders prompts with (None where the endpoint tokenizes)."""

    # -- rewards and updates -------------------------------------------------------------------
    @host_method("all", sum)
    @abc.abstractmethod
    def commit_rewards(self, rewards: dict[str, float]) -> int:
        """Attach rewards to kept calls by ``call_id``; returns how many were this host's."""

    @host_method("all", sum)
    @abc.abstractmethod
    def drop(self, call_ids: list[str]) -> int:
        """Forget kept calls (their trace failed); returns how many were this host's."""

    @host_method("all", _rank_metrics)
    @abc.abstractmethod
    def train_step(self, shared: dict[str, list[Sample]] | None = None,
                   keep_pending: bool = False) -> dict[str, dict[str, float]]:
        """Update every trainable policy that is due on its rewarded calls (plus ``shared`` calls of
        other policies); returns metrics per updated policy. ``keep_pending``: calls without a reward
        yet (their episodes are still running: asynchronous rollouts) wait for a later update."""

    @host_method("all", _merge)
    @abc.abstractmethod
    def advantages(self) -> dict[str, float]:
        """``{call_id: advantage}`` the last update trained with (a token-level one: its mean)."""

    @host_method("refuse")
    @abc.abstractmethod
    def rewarded(self, policies: list[str]) -> list[Sample]:
        """This host's rewarded calls of ``policies``, with their tokens (``share_from``)."""

    @host_method("refuse")
    @abc.abstractmethod
    def score(self, policy: str, samples: list[Sample]) -> list[list[float]]:
        """``policy``'s logprobs of each sample's completion tokens (``train.policy_kl``)."""

    @host_method("first")
    @abc.abstractmethod
    def get_step(self) -> int:
        """How many ``train_step`` calls this host has taken (resumed with its checkpoint)."""

    @host_method("all", _none)
    @abc.abstractmethod
    def park(self) -> None:
        """``offload_weights``: move the weights to CPU memory until they are next needed."""

    # -- evaluation ----------------------------------------------------------------------------
    @host_method("all", _none)
    @abc.abstractmethod
    def begin_eval(self) -> None:
        """Policies with a weight EMA serve their EMA weights until ``end_eval``."""

    @host_method("all", _none)
    @abc.abstractmethod
    def end_eval(self) -> None:
        """Back to the trained weights."""

    @contextmanager
    def evaluating(self):
        """``begin_eval`` ... ``end_eval`` as a block (a block cannot cross a process; two calls can)."""
        self.begin_eval()
        try:
            yield
        finally:
            self.end_eval()

    # -- state ---------------------------------------------------------------------------------
    @host_method("all", _none)
    @abc.abstractmethod
    def save(self, directory: str, *, weights_only: bool = False) -> None:
        """Write every trainable policy's state under ``directory`` (data parallel: rank 0 the
        weights, every rank its own optimizer share; ``weights_only``: no optimizer state, for a
        checkpoint that is evaluated or served but never resumed, such as ``checkpoints/best``)."""

    @host_method("all", _none)
    @abc.abstractmethod
    def load(self, directory: str, *, with_optimizer: bool = True) -> None:
        """Read what ``save`` wrote."""

    @host_method("all", _none)
    @abc.abstractmethod
    def load_weights(self, policy: str, directory: str) -> None:
        """Give ``policy`` (trainable or frozen) the weights another policy's ``save`` wrote in ``directory`` (its
        folder), and hand them to the engine: how an opponent pool takes a snapshot of the policy it trails."""

    @host_method("first")
    @abc.abstractmethod
    def fingerprint(self, policy: str) -> list[float]:
        """A cheap summary of a policy's weights (to tell whether they changed)."""

    @host_method("all", _none)
    @abc.abstractmethod
    def build_critic(self, policy: str, name: str, model: str, optim: Any, seed: int) -> None:
        """Build critic ``name`` in this host for ``policy`` (a second policy of the host shares it)."""

    # -- the host itself -----------------------------------------------------------------------
    @host_method("all", _concat)
    @abc.abstractmethod
    def where(self) -> list[dict]:
        """Where this host's processes run: one dict per process (name, pid, node, devices)."""

    @host_method("all", _concat)
    @abc.abstractmethod
    def take_memory(self) -> list[dict]:
        """GPU memory, one dict per device this host uses: ``device``, ``process`` (pid), the peak
        allocated and reserved since the last take (``peak_gib``, ``reserved_gib``; from the host
        that answers for its process's device, else absent), and the GiB it holds by part
        (``weights``, ``engine_kv``, ``engine_weights``, ``weight_copy``, ``optimizer``). [] without
        a GPU."""

    @host_method("all", _traffic, local=True)
    @abc.abstractmethod
    def take_traffic(self) -> dict[str, list[float]]:
        """Per method since the last take: ``[calls, bytes to the host, bytes back, seconds]`` of
        what crossed a process boundary ({} for a host in the driver's process)."""

    @host_method("all", _none, local=True)
    @abc.abstractmethod
    def close(self) -> None:
        """Release what the handle holds (threads, connections); the host's weights go with it."""
