"""One policy's state in a checkpoint folder: full weights (with config and tokenizer) or its
LoRA adapter, its value head, its optimizer state (the fp32 masters with the AdamW moments)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

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
