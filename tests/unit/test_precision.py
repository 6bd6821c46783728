"""Device and precision settings, the fp32-master optimizer, and the torch-free message module."""

import copy
import subprocess
import sys

import pytest
import torch

from masrl.config import load_config
from masrl.errors import ConfigError
from masrl.worker.model.precision import MasterWeightsAdamW, param_dtype, resolve_device

BASE = {"policies": {"p": {}}, "agents": {"solver": {"policy": "p"}}, "workflow": {"name": "math_solver"}}


def test_device_and_precision_settings_are_validated():
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["device=cpu", "precision=bf16", "policies.p.device=cpu"])
    assert cfg.device == "cpu" and cfg.precision == "bf16" and cfg.policy_device("p") == "cpu"
    with pytest.raises(ConfigError, match="device"):
        load_config(data=copy.deepcopy(BASE), overrides=["device=gpu"])
    with pytest.raises(ConfigError, match="replaced by `precision`"):
        load_config(data=dict(copy.deepcopy(BASE), dtype="bfloat16"))
    assert param_dtype("auto", "cpu") == torch.float32
    assert param_dtype("auto", "cuda:0") == torch.bfloat16
    assert param_dtype("fp32", "cuda:0") == torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_asking_for_cuda_without_a_gpu_says_so_and_names_the_key():
    from masrl.driver.checks import check_policies

    assert resolve_device("auto") == "cpu"
    cfg = load_config(data=copy.deepcopy(BASE), overrides=["policies.p.device=cuda:1"])
    with pytest.raises(ConfigError, match=r"policies\.p\.device: device 'cuda:1': this machine has no CUDA GPU"):
        check_policies(cfg)


def test_lora_policies_on_one_base_must_share_a_device(monkeypatch):
    import masrl.driver.checks as checks

    data = {"policies": {"a": {"lora": {"r": 4}}, "b": {"lora": {"r": 4}, "device": "cpu"}},
            "agents": {"solver": {"policy": "a"}, "x": {"policy": "b"}}, "workflow": {"name": "math_solver"},
            "model": "tiny-random"}
    cfg = load_config(data=copy.deepcopy(data), overrides=["device=cpu"])
    assert {p.device for p in checks.check_policies(cfg)} == {"cpu"}
    # this machine may have no GPU: pretend one resolves, to reach the check itself
    monkeypatch.setattr(checks, "resolve_device", lambda name: "cuda:0" if name.startswith("cuda") else name)
    cfg = load_config(data=copy.deepcopy(data), overrides=["device=cuda"])
    with pytest.raises(ConfigError, match="share one copy of it, so they need one device"):
        checks.check_policies(cfg)


def test_master_weights_keep_updates_that_bf16_would_round_away():
    torch.manual_seed(0)
    w0 = torch.randn(64, 64).to(torch.bfloat16)
    c = torch.randn(64, 64).to(torch.bfloat16)  # loss (w * c).sum(): the gradient is c whatever w's precision
    p16 = torch.nn.Parameter(w0.clone())
    plain16 = torch.nn.Parameter(w0.clone())
    ref = torch.nn.Parameter(w0.float())
    opt = MasterWeightsAdamW([p16], lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    opt_plain = torch.optim.AdamW([plain16], lr=1e-4, weight_decay=0.0)
    opt_ref = torch.optim.AdamW([ref], lr=1e-4, weight_decay=0.0)
    for _ in range(20):
        for p, o in ((p16, opt), (plain16, opt_plain), (ref, opt_ref)):
            o.zero_grad()
            for half in (0.5, 0.5):  # two micro-batches accumulate (in fp32 for the master)
                (p * c * half).float().sum().backward()
            o.step()
    master = opt.grads()[0]
    assert master.dtype == torch.float32
    assert torch.allclose(master, ref.detach(), atol=1e-6)  # the master is an fp32 AdamW run
    moved = (master - w0.float()).abs().mean().item()
    assert 1e-3 < moved < 3e-3  # 20 steps of ~1e-4
    # plain bf16 AdamW rounds most of those small steps away
    assert (plain16.detach() == w0).float().mean().item() > 0.5
    assert torch.equal(p16.detach(), master.detach().to(torch.bfloat16))  # weights follow their master
    # state round trip: the masters come back exactly
    fresh = torch.nn.Parameter(p16.detach().clone())
    opt2 = MasterWeightsAdamW([fresh], lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    opt2.load_state_dict(opt.state_dict())
    assert torch.equal(opt2.grads()[0], master)


def test_a_second_optimizer_over_the_same_bf16_parameter_owns_its_gradient():
    # a benchmark that builds one optimizer per side, or a rebuilt one: the earlier optimizer's hook must
    # not take the gradient first (it set .grad to None and the newer hook failed on it)
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    first = MasterWeightsAdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    second = MasterWeightsAdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    (p.float() * torch.arange(1.0, 5.0)).sum().backward()
    assert first.grads()[0].grad is None
    assert torch.equal(second.grads()[0].grad, torch.arange(1.0, 5.0))
    second.step()
    assert torch.all(p.detach() < 1)


def test_fp32_parameters_are_their_own_masters():
    p = torch.nn.Parameter(torch.ones(3))
    opt = MasterWeightsAdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    assert opt.grads()[0] is p
    p.sum().backward()
    opt.step()
    assert torch.all(p < 1)


def test_messages_import_no_torch():
    code = ("import sys, masrl.messages, masrl.config, masrl.trace; "
            "bad = [m for m in ('torch', 'transformers', 'peft') if m in sys.modules]; "
            "assert not bad, bad")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_bf16_units_are_read_from_the_cpu_flags(tmp_path):
    from masrl.worker.model.precision import cpu_bf16_units

    def info(flags):
        p = tmp_path / f"cpuinfo-{len(flags)}"
        p.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
        return str(p)

    assert cpu_bf16_units(info("fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni"))
    assert cpu_bf16_units(info("fpu avx2 amx_tile amx_bf16"))
    assert not cpu_bf16_units(info("fpu sse2 avx2 avx512f avx512bw"))  # AVX-512 without its bf16 part
    assert not cpu_bf16_units(str(tmp_path / "missing"))
