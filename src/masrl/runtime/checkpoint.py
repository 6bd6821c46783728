"""Per-policy checkpoints: full weights or adapter, value head, optimizer state.

Layout of one checkpoint directory (written to a temp name and renamed, so an interrupted
save never leaves a half-written checkpoint behind):

  step_000005/
    state.json                 step, policies, config name
    <policy>/model.safetensors (full)  or  adapter.safetensors + adapter.json (LoRA)
    <policy>/value_head.safetensors    (PPO with a critic)
    <policy>/optimizer.pt
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from masrl.errors import MasrlError

STEP_DIR = re.compile(r"^step_(\d{6})$")
_LEFTOVER = re.compile(r"^step_(\d{6})\.old$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_checkpoint(root: Path) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    found = sorted((int(m.group(1)), p.name.endswith(".old"), p) for p in root.iterdir()
                   if (m := STEP_DIR.match(p.name) or _LEFTOVER.match(p.name)) and (p / "state.json").is_file())
    # a step_N.old is complete: it was moved aside just before a crash; step_N wins when both exist
    best: dict[int, Path] = {}
    for step, is_old, p in found:
        if step not in best or not is_old:
            best[step] = p
    return best[max(best)] if best else None


def resolve_checkpoint(given: str | Path) -> Path:
    """The checkpoint folder ``given`` names: a ``step_NNNNNN`` folder, or a run directory (its
    latest checkpoint). Checked before any model loads; the error says what was expected."""
    path = Path(given)
    if (path / "state.json").is_file():
        return path
    if not path.exists():
        raise MasrlError(f"--checkpoint {given}: no such file or directory")
    latest = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
    if latest is None:
        raise MasrlError(f"--checkpoint {given}: no checkpoint there (expected a step_NNNNNN folder with state.json, "
                         f"or a run directory holding checkpoints/)")
    return latest


def _state_dict_for_save(host, policy: str) -> dict[str, torch.Tensor]:
    if host.is_lora:
        from peft import get_peft_model_state_dict

        sd = get_peft_model_state_dict(host.model, adapter_name=policy)
    else:
        sd = host.model.state_dict()
        # tied weights share storage; safetensors refuses duplicates
        if getattr(host.core.config, "tie_word_embeddings", False):
            sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in sd.items()}


def save_policy(host, policy: str, optimizer, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    sd = _state_dict_for_save(host, policy)
    if host.is_lora:
        save_file(sd, str(directory / "adapter.safetensors"))
        spec = host.policies[policy].lora
        (directory / "adapter.json").write_text(json.dumps({"base": host.model_name, "r": spec.r, "alpha": spec.alpha,
                                                            "target_modules": list(spec.target_modules)}))
    else:
        save_file(sd, str(directory / "model.safetensors"))
        host.core.config.save_pretrained(str(directory))
        host.tokenizer.save_pretrained(str(directory))
    if policy in host.value_heads:
        save_file({k: v.detach().cpu() for k, v in host.value_heads[policy].state_dict().items()},
                  str(directory / "value_head.safetensors"))
    if optimizer is not None:
        torch.save(optimizer.state_dict(), directory / optimizer.file_name)


def load_policy(host, policy: str, optimizer, directory: Path, *, with_optimizer: bool = True) -> None:
    if not directory.is_dir():
        raise MasrlError(f"checkpoint has no folder for policy '{policy}' ({directory}); was it saved by another config?")
    if host.is_lora:
        from peft import set_peft_model_state_dict

        path = directory / "adapter.safetensors"
        if not path.is_file():
            raise MasrlError(f"{path} is missing: policy '{policy}' is LoRA in this config but not in the checkpoint")
        result = set_peft_model_state_dict(host.model, load_file(str(path)), adapter_name=policy)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise MasrlError(f"{path}: adapter weights do not fit policy '{policy}' ({len(unexpected)} unexpected keys)")
    else:
        path = directory / "model.safetensors"
        if not path.is_file():
            raise MasrlError(f"{path} is missing: policy '{policy}' is a full model in this config but not in the checkpoint")
        missing, unexpected = host.model.load_state_dict(load_file(str(path)), strict=False)  # copies onto its device
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise MasrlError(f"{path}: weights do not fit the model of policy '{policy}' "
                             f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
        if getattr(host.core.config, "tie_word_embeddings", False):
            host.core.tie_weights()
    vh = directory / "value_head.safetensors"
    if policy in host.value_heads and vh.is_file():
        host.value_heads[policy].load_state_dict(load_file(str(vh)))
    if optimizer is None:
        return
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


def write_atomically(target: Path, fill) -> Path:
    """Call ``fill(tmp_dir)``, then put ``tmp_dir`` in ``target``'s place.

    A checkpoint that already sits at ``target`` is moved aside (``.old``) and deleted only once
    the new one is in place; if the process dies between the two renames, ``latest_checkpoint``
    finds the ``.old`` one, so there is always a complete checkpoint.
    """
    tmp = target.with_name(target.name + ".tmp")
    old = target.with_name(target.name + ".old")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    fill(tmp)
    if target.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)
    return target


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (and leftovers of interrupted saves)."""
    root = Path(root)
    if keep <= 0 or not root.is_dir():
        return []
    done = sorted((int(m.group(1)), p) for p in root.iterdir()
                  if (m := STEP_DIR.match(p.name)) and (p / "state.json").is_file())
    removed = [p for _, p in done[:-keep]]
    newest = done[-1][0] if done else None
    for p in root.iterdir():
        m = _LEFTOVER.match(p.name)
        if m and newest is not None and int(m.group(1)) <= newest and not p.name.endswith(".tmp"):
            removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed
