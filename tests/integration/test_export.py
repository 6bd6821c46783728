"""masrl export: a run's full policies load with transformers' own ``from_pretrained`` and its LoRA
policies with PEFT's ``PeftModel.from_pretrained`` (merged ones as plain models), and each gives the
logits the trainer's own model gives with the checkpoint loaded (the real peft, on the CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from masrl.cli import main
from masrl.driver.builder import build_runtime
from masrl.driver.run.rundir import RunDir

SMALL = ["model=tiny-random", "data.train.n=8", "data.eval.n=2", "train.eval_before=false", "train.eval_after=false",
         "threads=1", "train.steps=1"]
INPUT = torch.tensor([[1, 17, 250, 3, 99, 42, 7, 512]])


def trained(tmp_path, config: str, *extra: str):
    run = tmp_path / config.replace("/", "_")
    assert main(["train", config, *SMALL, *extra, f"output_dir={run}"]) == 0
    return RunDir(run)


def trainer_logits(run: RunDir, policy: str) -> torch.Tensor:
    """The logits of ``policy`` in the trainer's own model, the run's checkpoint loaded as a resume loads it."""
    rt = build_runtime(run.config(), log=lambda *_: None)
    try:
        for w in rt.workers:
            w.load(str(run.latest()), with_optimizer=False)
        w = next(w for w in rt.workers if policy in w.held.policies)
        model = w.held.model
        if w.held.is_lora:
            model.set_adapter(policy)
        with torch.no_grad():
            return model(INPUT).logits.float()
    finally:
        rt.close()


def perturb_adapters(ckpt, policies) -> None:
    """Give every adapter non-zero B matrices (a step on a random model learns nothing to export)."""
    g = torch.Generator().manual_seed(0)
    for name in policies:
        path = ckpt / name / "adapter.safetensors"
        sd = load_file(str(path))
        save_file({k: (torch.randn(v.shape, generator=g) * 0.05 if "lora_B" in k else v) for k, v in sd.items()},
                  str(path))


def perturb_full(ckpt, policies) -> None:
    """Move each model's weights off the seed's (a step on a random model learns nothing to export)."""
    g = torch.Generator().manual_seed(1)
    for name in policies:
        path = ckpt / name / "model.safetensors"
        save_file({k: v + torch.randn(v.shape, generator=g) * 0.02 for k, v in load_file(str(path)).items()}, str(path))


def test_full_weights_export_as_a_transformers_folder(tmp_path, capsys):
    run = trained(tmp_path, "math/team_two_policies")
    perturb_full(run.latest(), ["reasoner", "writer"])
    to = tmp_path / "export"
    assert main(["export", str(run.path), "--to", str(to)]) == 0
    record = json.loads((to / "export.json").read_text())
    assert {p: r["kind"] for p, r in record["policies"].items()} == {"reasoner": "full", "writer": "full"}
    for policy in record["policies"]:
        assert not any(f.name.startswith("optimizer") for f in (to / policy).iterdir())
        model = AutoModelForCausalLM.from_pretrained(str(to / policy)).eval()
        with torch.no_grad():
            got = model(INPUT).logits.float()
        want = trainer_logits(run, policy)
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert main(["export", str(run.path), "--to", str(to)]) == 2  # never over an export
    assert "not empty" in capsys.readouterr().err


def test_lora_adapters_export_for_peft_and_merged(tmp_path):
    from peft import PeftModel

    run = trained(tmp_path, "math/team_lora")
    policies = list(run.config().policies)
    perturb_adapters(run.latest(), policies)
    to, merged = tmp_path / "peft", tmp_path / "merged"
    assert main(["export", str(run.path), "--to", str(to)]) == 0
    assert main(["export", str(run.path), "--to", str(merged), "--merge"]) == 0
    base_logits = None
    for policy in policies:
        want = trainer_logits(run, policy)
        cfg = json.loads((to / policy / "adapter_config.json").read_text())
        assert cfg["peft_type"] == "LORA" and cfg["base_model_name_or_path"] == str((to / "base").resolve())
        base = AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"]).eval()
        with torch.no_grad():
            base_logits = base(INPUT).logits.float()
            peft = PeftModel.from_pretrained(base, str(to / policy)).eval()
            got = peft(INPUT).logits.float()
            flat = AutoModelForCausalLM.from_pretrained(str(merged / policy)).eval()(INPUT).logits.float()
        assert not torch.allclose(want, base_logits, atol=1e-3)  # the adapter changes the model
        assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
        assert torch.allclose(flat, want, atol=1e-4), (flat - want).abs().max()


def test_export_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--to", str(tmp_path / "x")]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.parametrize("step", ["best", "9"])
def test_export_names_a_missing_checkpoint(tmp_path, capsys, step):
    run = trained(tmp_path, "math/solver")
    assert main(["export", str(run.path), "--step", step, "--to", str(tmp_path / "x")]) == 2
    assert ("no best checkpoint" if step == "best" else "no checkpoint of step 9") in capsys.readouterr().err
