"""A worker's whole state in a checkpoint folder, and back.

``PolicyFiles`` writes one policy: its full weights (with config and tokenizer) or its LoRA adapter, its
value head, its optimizer state (the fp32 masters with the AdamW moments). ``Checkpoint`` decides what a
worker writes around it: which rank writes what under data parallelism, a sharded (fsdp)
policy's shards beside its gathered weights, EMA weights, critics, and the worker's counters (step,
reward statistics, updates per policy). A ``PolicyWorker``'s ``save`` and ``load`` (the ones a driver or a
Ray actor calls) are its ``Checkpoint``'s.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from masrl.algorithms.normalize import RunningMoments
from masrl.errors import MasrlError


class PolicyFiles:
    """One policy's files of ``held`` (a ``HeldModel``) in a checkpoint folder, written and read back."""

    def __init__(self, held):
        self.held = held

    def _state_dict(self, policy: str, weights=None) -> dict[str, torch.Tensor]:
        if weights is not None:  # a sharded policy: its gathered full copy
            sd = weights.state_dict()
            if getattr(self.held.core.config, "tie_word_embeddings", False):
                sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        elif self.held.is_lora:
            from peft import get_peft_model_state_dict

            sd = get_peft_model_state_dict(self.held.model, adapter_name=policy)
        else:
            sd = self.held.model.state_dict()
            # tied weights share storage; safetensors refuses duplicates
            if getattr(self.held.core.config, "tie_word_embeddings", False):
                sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
        return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in sd.items()}

    def save(self, policy: str, optimizer, directory: Path, weights=None) -> None:
        """``weights``: the module whose state is the policy's full weights, when not ``self.held.model``."""
        directory.mkdir(parents=True, exist_ok=True)
        sd = self._state_dict(policy, weights)
        if self.held.is_lora:
            save_file(sd, str(directory / "adapter.safetensors"))
            spec = self.held.policies[policy].lora
            (directory / "adapter.json").write_text(json.dumps({"base": self.held.model_name, "r": spec.r, "alpha": spec.alpha,
                                                                "dropout": spec.dropout,
                                                                "target_modules": list(spec.target_modules),
                                                                "seed": getattr(self.held, "seed", None)}))
        else:
            save_file(sd, str(directory / "model.safetensors"))
            self.held.core.config.save_pretrained(str(directory))
            self.held.tokenizer.save_pretrained(str(directory))
        if policy in self.held.value_heads:
            save_file({k: v.detach().cpu() for k, v in self.held.value_heads[policy].state_dict().items()},
                      str(directory / "value_head.safetensors"))
        if optimizer is not None:
            torch.save(optimizer.state_dict(), directory / optimizer.file_name)

    def load(self, policy: str, optimizer, directory: Path, *, with_optimizer: bool = True) -> None:
        if not directory.is_dir():
            raise MasrlError(f"checkpoint has no folder for policy '{policy}' ({directory}); was it saved by another config?")
        self.load_weights(policy, directory)
        vh = directory / "value_head.safetensors"
        if policy in self.held.value_heads and vh.is_file():
            self.held.value_heads[policy].load_state_dict(load_file(str(vh)))
        if optimizer is not None:
            self._load_optimizer(optimizer, directory, with_optimizer)

    def load_weights(self, policy: str, directory: Path) -> None:
        if self.held.is_lora:
            from peft import set_peft_model_state_dict

            path = directory / "adapter.safetensors"
            if not path.is_file():
                raise MasrlError(f"{path} is missing: policy '{policy}' is LoRA in this config but not in the checkpoint")
            result = set_peft_model_state_dict(self.held.model, load_file(str(path)), adapter_name=policy)
            unexpected = getattr(result, "unexpected_keys", [])
            if unexpected:
                raise MasrlError(f"{path}: adapter weights do not fit policy '{policy}' ({len(unexpected)} unexpected keys)")
        else:
            path = directory / "model.safetensors"
            if not path.is_file():
                raise MasrlError(f"{path} is missing: policy '{policy}' is a full model in this config but not in the checkpoint")
            missing, unexpected = self.held.model.load_state_dict(load_file(str(path)), strict=False)  # copies onto its device
            missing = [k for k in missing if k != "lm_head.weight"]
            if missing or unexpected:
                raise MasrlError(f"{path}: weights do not fit the model of policy '{policy}' "
                                 f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
            if getattr(self.held.core.config, "tie_word_embeddings", False):
                self.held.core.tie_weights()

    @staticmethod
    def _load_optimizer(optimizer, directory: Path, with_optimizer: bool) -> None:
        optimizer.sync_from_params()  # fp32 masters follow the loaded weights, then the saved masters win
        opt = directory / optimizer.file_name
        if with_optimizer and opt.is_file():
            # saved on any device, loaded on this one (AdamW moves its state to its parameters' device)
            state = torch.load(opt, map_location="cpu", weights_only=False)
            if "masters" not in state and (directory / "optimizer.pt").is_file():
                # a sharded rank's own file holds its moments only; the fp32 masters, the same on
                # every rank, are in rank 0's
                first = torch.load(directory / "optimizer.pt", map_location="cpu", weights_only=False, mmap=True)
                state["masters"] = first.get("masters", [])
            optimizer.load_state_dict(state)


class Checkpoint:
    """The checkpoint folder of one worker: ``held`` (a ``HeldModel``), ``updater`` (its optimizers,
    EMA weights, critics and counters) and ``sampler`` (the engine the loaded weights go to)."""

    def __init__(self, held, updater, sampler):
        self.held, self.updater, self.sampler = held, updater, sampler
        self.files = PolicyFiles(held)

    def _critics(self) -> list:
        """Each critic once (policies of one worker may share one)."""
        return list({id(c): c for c in self.updater.critics.values()}.values())

    def _counters_file(self, d: Path) -> Path:
        return d / f"worker_{'_'.join(self.held.policies)}.json"

    def _snapshots(self) -> list[str]:
        """Frozen policies that hold snapshots of another (an opponent pool): saved with the checkpoint, as
        their weights change during the run."""
        return [p.name for p in self.held.policies.values() if getattr(p, "snapshot_of", None)]

    def save(self, d: Path, *, weights_only: bool = False) -> None:
        """Every trainable policy's state (a frozen policy never changes: nothing to save);
        ``weights_only``: without the policies' optimizer state (with AdamW's fp32 masters and moments,
        most of a full checkpoint; ``load`` then keeps the optimizer it has). Critics are written whole."""
        held, up = self.held, self.updater
        if held.sharded is not None:
            self._save_sharded(d, weights_only)
            return
        if up.dp is not None and up.dp.rank > 0:  # rank 0 writes the state all ranks share
            if weights_only:
                return
            for name, opt in up.optimizers.items():
                if opt.shard_of is not None:  # its own share of the optimizer state
                    (d / name).mkdir(parents=True, exist_ok=True)
                    torch.save(opt.state_dict(), d / name / opt.file_name)
            return
        for name in self.held.trainable:
            self.files.save(name, None if weights_only else up.optimizers.get(name), d / name)
        for name in self._snapshots():  # frozen, but not fixed: an opponent pool's member
            self.files.save(name, None, d / name)
        for name, ema in up.emas.items():
            torch.save(ema.state_dict(), d / name / "ema.pt")
        for critic in self._critics():  # a shared one is written by each holder
            (d / "critics").mkdir(parents=True, exist_ok=True)
            torch.save(critic.state_dict(), d / "critics" / f"{critic.name}.pt")
        self._save_counters(d)

    def load_weights(self, policy: str, d: Path) -> None:
        """``policy``'s weights from a folder another policy's save wrote (``d`` holds its ``model.safetensors``),
        then handed to the engine. Full models only (a snapshot of a LoRA adapter is not built)."""
        held = self.held
        if policy not in held.policies:
            raise MasrlError(f"this host holds no policy '{policy}' (it holds {', '.join(held.policies)})")
        if held.is_lora or held.sharded is not None:
            raise MasrlError(f"policy '{policy}': weights can be copied into a full, unsharded model only")
        with torch.no_grad():
            self.files.load_weights(policy, d)
        self.sampler.publish([policy], self.updater.updates)

    def _save_sharded(self, d: Path, weights_only: bool = False) -> None:
        """fsdp: every rank writes its shards (``NAME/fsdp/``, torch.distributed.checkpoint; not with
        ``weights_only``); rank 0 also writes the full weights from the engine's gathered copy
        (``NAME/model.safetensors``, what ``serve`` and ``eval --checkpoint`` load) and the worker's counters."""
        held, up = self.held, self.updater
        for name in self.held.trainable:
            if not weights_only:
                held.sharded.save(up.optimizers[name].opt, d / name / "fsdp")
            if up.dp.rank == 0:
                self.files.save(name, None, d / name, weights=self.sampler.copy.model)
        if up.dp.rank == 0:
            self._save_counters(d)

    def _save_counters(self, d: Path) -> None:
        up = self.updater
        self._counters_file(d).write_text(json.dumps(
            {"step": up.step, "reward_stats": {k: v.state_dict() for k, v in up.reward_stats.items()},
             "estimator_state": up.estimator_state, "updates": up.updates}))

    def _load_sharded(self, name: str, d: Path, with_optimizer: bool) -> None:
        """fsdp: the shards from ``NAME/fsdp/`` (fp32, with the AdamW moments), or, where only full
        weights were saved, those split over the ranks."""
        shards = d / name / "fsdp"
        if (shards / ".metadata").is_file():
            self.held.sharded.load(self.updater.optimizers[name].opt, shards, with_optimizer)
            return
        from safetensors.torch import load_file

        path = d / name / "model.safetensors"
        if not path.is_file():
            raise MasrlError(f"{path} is missing: policy '{name}' is a full model in this config but not in the "
                             f"checkpoint")
        self.held.sharded.load_full(load_file(str(path)))

    def load(self, d: Path, *, with_optimizer: bool = True) -> None:
        """What ``save`` wrote; the engine gets the loaded weights before this returns."""
        held, up = self.held, self.updater
        for name in self.held.trainable:
            if held.sharded is not None:
                self._load_sharded(name, d, with_optimizer)
                continue
            self.files.load(name, up.optimizers.get(name), d / name, with_optimizer=with_optimizer)
        for name in self._snapshots():
            if (d / name / "model.safetensors").is_file():
                with torch.no_grad():
                    self.files.load_weights(name, d / name)
        for critic in self._critics():
            f = d / "critics" / f"{critic.name}.pt"
            if f.is_file():
                critic.load_state_dict(torch.load(f, weights_only=True), with_optimizer=with_optimizer)
        meta = self._counters_file(d)
        if meta.is_file():
            counters = json.loads(meta.read_text())
            up.step = counters["step"]
            up.reward_stats = {k: RunningMoments.from_state(v) for k, v in counters.get("reward_stats", {}).items()}
            up.estimator_state = counters.get("estimator_state", {})
            up.updates.update(counters.get("updates", {}))
        self.sampler.publish(None, up.updates)
        for name, ema in up.emas.items():
            if (d / name / "ema.pt").is_file():
                ema.load_state_dict(torch.load(d / name / "ema.pt", weights_only=True))
