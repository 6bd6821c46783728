"""A run's checkpoint as folders other tools load: ``masrl export RUN --to DIR``.

A checkpoint keeps each trained policy in its own folder (``worker/model/checkpoint.py``): a full model as a
Hugging Face folder beside its optimizer state, a LoRA adapter as ``adapter.safetensors`` holding
PEFT's own keys beside masrl's ``adapter.json``. Export writes, per policy:

  DIR/<policy>/   full model: ``config.json``, ``model.safetensors``, the tokenizer
                  (``AutoModelForCausalLM.from_pretrained`` loads it, vLLM serves it)
                  LoRA: ``adapter_config.json`` + ``adapter_model.safetensors``
                  (``PeftModel.from_pretrained``, vLLM's ``LoRARequest``); with ``merge``, the
                  adapter folded into its base as a full model folder
  DIR/base/       the adapters' base, where it has no folder of its own (a random-weight alias,
                  redrawn from its seed; a GGUF file, converted)
  DIR/export.json what was exported: the run, the step, each policy's kind and each agent's policy

Frozen policies are not in a checkpoint (they never change); ``export.json`` names their model.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from masrl.errors import MasrlError

_NOT_EXPORTED = ("optimizer", "ema.pt", "value_head.safetensors", "fsdp", "adapter.json", "adapter.safetensors")


def export_run(cfg, checkpoint: Path, to: str | Path, *, merge: bool = False, log=print) -> dict[str, str]:
    """Write ``checkpoint``'s policies (a checkpoint of a run trained with ``cfg``) into ``to``; returns
    ``{policy: what was written}``. Written beside ``to`` and renamed into place, so a failed export
    leaves nothing half-written."""
    checkpoint, to = Path(checkpoint), Path(to)
    if to.exists() and (not to.is_dir() or any(to.iterdir())):
        raise MasrlError(f"--to {to}: {'not a folder' if not to.is_dir() else 'the folder is not empty'}; give a new one")
    tmp = to.with_name(to.name + ".tmp-export")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        written, record = {}, {}
        bases: dict[tuple, tuple[Path, Path]] = {}
        for name in cfg.policies:
            src = checkpoint / name
            if (src / "adapter.safetensors").is_file():
                meta = json.loads((src / "adapter.json").read_text())
                key = (meta["base"], meta.get("seed"))
                if key not in bases:
                    bases[key] = _base_folder(meta["base"], meta.get("seed", cfg.seed), tmp / "base", to / "base", log)
                here, named = bases[key]
                if merge:
                    _merged(src, meta, here, tmp / name)
                    written[name], record[name] = "merged into its base", {"kind": "merged"}
                else:
                    _peft_folder(src, meta, named, tmp / name)
                    written[name], record[name] = "PEFT adapter", {"kind": "lora", "base": str(named)}
            elif (src / "model.safetensors").is_file():
                _full_folder(src, tmp / name)
                written[name], record[name] = "full model", {"kind": "full"}
            else:
                record[name] = {"kind": "frozen", "model": cfg.policy_model(name)}
        if not written:
            raise MasrlError(f"{checkpoint}: no trained policy's weights in it (policies: {', '.join(cfg.policies)})")
        state = json.loads((checkpoint / "state.json").read_text())
        (tmp / "export.json").write_text(json.dumps({
            "run": cfg.name, "checkpoint": str(checkpoint), "step": state.get("step"), "policies": record,
            "agents": {a: spec.policy for a, spec in cfg.agents.items()}}, indent=1))
        if to.exists():
            to.rmdir()
        os.replace(tmp, to)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def _full_folder(src: Path, dst: Path) -> None:
    """The checkpoint's folder without what only training reads (optimizer state, EMA, value head)."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith(_NOT_EXPORTED):
            shutil.copy2(f, dst / f.name)


def _peft_folder(src: Path, meta: dict, base: Path, dst: Path) -> None:
    """PEFT's adapter layout: the saved tensors already carry PEFT's key names."""
    from peft import LoraConfig

    dst.mkdir(parents=True)
    LoraConfig(r=meta["r"], lora_alpha=meta["alpha"], lora_dropout=meta.get("dropout", 0.0),
               target_modules=list(meta["target_modules"]), task_type="CAUSAL_LM", bias="none",
               base_model_name_or_path=str(base)).save_pretrained(str(dst))
    shutil.copy2(src / "adapter.safetensors", dst / "adapter_model.safetensors")


def _merged(src: Path, meta: dict, base: Path, dst: Path) -> None:
    """The adapter folded into a fresh copy of its base (fp32), saved as a full model folder."""
    import tempfile

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        _peft_folder(src, meta, base, Path(d) / "adapter")
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        merged = PeftModel.from_pretrained(model, str(Path(d) / "adapter")).merge_and_unload()
    merged.save_pretrained(str(dst))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(dst))


def _base_folder(model: str, seed: int, tmp_target: Path, final: Path, log) -> tuple[Path, Path]:
    """A Hugging Face folder of an adapter's base: the model's own, or one written under ``DIR/base``.
    Returns where it is now and the name adapters give it (its place once the export is renamed)."""
    from masrl.models import resolve_model, smollm2_model_dir

    src = resolve_model(model)
    if src.kind == "hf_dir":
        return Path(src.name), Path(src.name).resolve()
    if src.kind == "alias" and src.name == "smollm2-135m-instruct":
        return smollm2_model_dir(), smollm2_model_dir()
    from masrl.models import load_model

    log(f"[masrl] writing the base {model} (seed {seed}) to {final}")
    weights, tok = load_model(model, seed=seed)
    weights.save_pretrained(str(tmp_target))
    tok.save_pretrained(str(tmp_target))
    return tmp_target, final.resolve()
