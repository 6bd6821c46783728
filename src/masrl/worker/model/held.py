"""HeldModel: the weights one worker holds in memory.

Either one full model serving one policy, or one frozen base with a LoRA adapter per policy
(PEFT multi-adapter). In the LoRA case the base is held once however many policies share it,
the reference model is the base with adapters disabled (free), and each policy's trainable
parameters are its own adapter's (plus its value head under PPO).
"""

from __future__ import annotations

import contextlib
import copy

import torch
from torch import nn

from masrl.models import load_model
from masrl.policies import PolicySpec
from masrl.worker.model.offload import PinnedStash, module_tensors


def _peft_config(spec: PolicySpec):
    from peft import LoraConfig

    lora = spec.lora
    assert lora is not None
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
        bias="none",
    )


def _check_layout(policies: list[PolicySpec]) -> None:
    if not policies:
        raise ValueError("a HeldModel needs at least one policy")
    lora = [p.is_lora for p in policies]
    if any(lora) and any(not p.is_lora and p.trainable for p in policies):
        raise ValueError("a LoRA host serves its adapters and frozen policies of its base, not a trainable full model")
    if not any(lora) and len(policies) > 1:
        raise ValueError("full-model policies each need their own HeldModel")


def _with_adapters(model, lora_policies: list[PolicySpec]):
    """The frozen base with one LoRA adapter per policy (adapters in fp32 on any base: they are small)."""
    from peft import get_peft_model

    model.requires_grad_(False)
    first, *rest = lora_policies
    model = get_peft_model(model, _peft_config(first), adapter_name=first.name)
    for p in rest:
        model.add_adapter(p.name, _peft_config(p))
    for n, prm in model.named_parameters():
        if "lora_" in n:
            prm.data = prm.data.float()
    return model


class HeldModel:
    def __init__(
        self,
        model_name: str,
        policies: list[PolicySpec],
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        need_reference: bool = False,
        need_critic: bool = False,
    ):
        _check_layout(policies)
        self.model_name = model_name
        self.policies = {p.name: p for p in policies}
        self.is_lora = any(p.is_lora for p in policies)
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed  # a random-weight base is drawn from it (an exported adapter's base is drawn again)
        self.ref_stash = PinnedStash()  # the reference model, with offload_reference
        self.stash = PinnedStash()  # the policies' weights, with offload_weights (park / unpark)
        self.parked = False
        self.sharded = None  # ShardedPolicy once its ranks have joined (policies.X.fsdp: worker.sharding)
        self.sharded_reference = None  # the reference model's, sharded the same way (algorithm.kl_coef > 0)
        torch.manual_seed(seed)
        model, self.tokenizer = load_model(model_name, seed=seed, dtype=dtype, device=device)
        self.reference: nn.Module | None = None
        if self.is_lora:
            self.model = _with_adapters(model, [p for p in policies if p.is_lora])
            self.core = self.model.get_base_model()
        else:
            self.model = model
            self.core = model
            if need_reference and policies[0].trainable:
                self.reference = copy.deepcopy(model).requires_grad_(False).eval()
                if policies[0].offload_reference and torch.device(self.device).type == "cuda":
                    self.ref_stash.out(module_tensors(self.reference))
        self.value_heads: dict[str, nn.Linear] = self._value_heads() if need_critic else {}
        for name, spec in self.policies.items():
            for p in self.policy_parameters(name):
                p.requires_grad_(spec.trainable)
        self.model.eval()

    def _value_heads(self) -> dict[str, nn.Linear]:
        """A zero-initialised value head per policy whose values no separate critic gives (fp32: its
        inputs are cast up)."""
        hidden = self.core.config.hidden_size
        heads = {}
        for name, spec in self.policies.items():
            if spec.critic is not None:
                continue
            head = nn.Linear(hidden, 1).to(self.device)
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)
            heads[name] = head
        return heads

    @property
    def trainable(self) -> list[str]:
        """The names of the policies an optimizer updates (frozen ones serve only)."""
        return [n for n, p in self.policies.items() if p.trainable]

    # -- parameters ----------------------------------------------------------------------------
    def policy_parameters(self, policy: str) -> list[nn.Parameter]:
        """The parameters that ``policy``'s optimizer updates, and no others."""
        if self.is_lora and not self.policies[policy].is_lora:  # a frozen policy served by the bare base
            return []
        if self.is_lora:
            params = [p for n, p in self.model.named_parameters() if "lora_" in n and f".{policy}." in n]
        else:
            params = list(self.model.parameters())
        if policy in self.value_heads:
            params += list(self.value_heads[policy].parameters())
        return params

    def adapter_for(self, policy: str) -> str | None:
        return policy if self.is_lora and self.policies[policy].is_lora else None

    @contextlib.contextmanager
    def active(self, policy: str):
        """Make ``policy``'s weights the ones a forward pass uses."""
        if self.is_lora:
            prev = self.model.active_adapter
            self.model.set_adapter(policy)
            # set_adapter flips requires_grad of adapters; restore ours
            for name, spec in self.policies.items():
                for p in self.policy_parameters(name):
                    p.requires_grad_(spec.trainable and name == policy)
            try:
                yield
            finally:
                self.model.set_adapter(prev)
        else:
            yield

    @contextlib.contextmanager
    def reference_resident(self):
        """With ``offload_reference``: the reference model on the device inside this block, in pinned
        CPU memory outside it (``ref_stash.moved_s`` adds up the time spent moving it)."""
        if self.ref_stash.home is None:
            yield
            return
        tensors = module_tensors(self.reference)
        self.ref_stash.back(tensors)
        try:
            yield
        finally:
            self.ref_stash.out(tensors)

    def engine_copy(self, trainable: list[str], compute: torch.dtype, *, fsdp: bool, overlap_update: bool,
                    device: str | None):
        """The weights the engine samples from when not the live ones, or None: under fsdp a full copy in
        ``compute``, gathered from the shards after each update (``EngineWeights``); under ``overlap_update``
        (with policies to train) or on another ``device``, a ``WeightCopy`` of the ``trainable`` policies'
        weights, so an update can run while the engine samples."""
        if fsdp:
            from masrl.worker.parallel.sharding import EngineWeights

            return EngineWeights(self.model, compute)
        if (overlap_update and trainable) or device:
            from masrl.worker.model.weight_copy import WeightCopy

            return WeightCopy(self.model, {n: self.policy_parameters(n) for n in trainable}, device=device)
        return None

    def fingerprint(self, policy: str, copy=None) -> list[float]:
        """Sum and sum of squares of ``policy``'s weights (on the CPU, so equal weights give equal numbers
        wherever they are kept); sharded (fsdp): the engine's full ``copy``, gathered at the last update."""
        with torch.no_grad():
            live = list(copy.model.parameters()) if self.sharded is not None else self.policy_parameters(policy)
            params = [p.detach().to("cpu", torch.float64) for p in live]
            return [float(sum(p.sum() for p in params)), float(sum((p ** 2).sum() for p in params))]

    # -- offload_weights -----------------------------------------------------------------------
    def tensors(self) -> list[torch.Tensor]:
        """Every weight this model serves: the model (or the base with all its adapters) and value heads."""
        out = module_tensors(self.model)
        for h in self.value_heads.values():
            out += list(h.parameters())
        return out

    def park(self, extra: list[torch.Tensor] = ()) -> int:
        """Every weight this model serves, and ``extra`` (EMA copies), into pinned CPU memory; returns bytes
        moved (``stash.moved_s`` and ``moved_bytes`` add up every trip)."""
        self.parked = True
        return self.stash.out(self.tensors() + list(extra))

    def unpark(self, extra: list[torch.Tensor] = ()) -> int:
        self.parked = False
        return self.stash.back(self.tensors() + list(extra))

    @contextlib.contextmanager
    def reference_mode(self):
        """Forward passes inside use the reference (initial) weights."""
        if self.is_lora:
            with self.model.disable_adapter():
                yield self.core
        else:
            if self.reference is None:
                raise RuntimeError("no reference model: set algorithm.kl_coef > 0 to keep one")
            yield self.reference

    # -- forward -------------------------------------------------------------------------------
    def hidden_states(self, module: nn.Module, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Last hidden states ``[B, L, H]`` of a causal LM module (no output head)."""
        return module.model(input_ids=ids, attention_mask=attn).last_hidden_state

    def fast_forward(self, module: nn.Module):
        """A LlamaForward over ``module`` (the policy model or the reference), or None if unsupported."""
        from masrl.modeling import lean as llama_forward

        cache = self.__dict__.setdefault("_fast", {})
        key = id(module)
        if key not in cache:
            target = self.model if module is self.core else module
            cache[key] = llama_forward.LlamaForward(target) if llama_forward.supports(target) else None
            if cache[key] is None:
                llama_forward.notice_fallback(target, "training")
        return cache[key]

    def sharded_for(self, module: nn.Module):
        """The ShardedPolicy whose forward runs ``module`` (the policy's or the reference's), or None."""
        for sh in (self.sharded, self.sharded_reference):
            if sh is not None and sh.core is module:
                return sh
        return None

    def train_mode(self, on: bool) -> None:
        self.model.train(on)
        for h in self.value_heads.values():
            h.train(on)
