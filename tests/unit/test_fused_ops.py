"""The fused Triton ops agree with torch, forward and backward (run by Triton's CPU interpreter in a
subprocess; skipped where triton is not installed, as on CPU-only torch builds). On a GPU the same
checks run at start-up (tests/gpu)."""

import importlib.util
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")

CODE = """
import torch
from masrl.engines import kernels
from masrl.modeling import fused
cpu = torch.device("cpu")
for dtype in (torch.float32, torch.bfloat16):
    print(dtype, kernels.check(cpu, dtype, 9, 3, 64, 576, 1536))
with torch.inference_mode():  # the first use may come from an engine's prefill
    print("training", fused.enabled(cpu))
"""


def test_fused_kernels_agree_with_torch_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 3
    for line in lines[:2]:
        assert "'rms_norm': None" in line and "'silu_mul': None" in line
        assert "'rope_and_cache': None" in line and "'decode_attention': None" in line
    assert lines[2] == "training {'rope': True, 'swiglu': True, 'token_logprobs': True}"


PAGED = """
import torch
from masrl.engines import paged_kernels
paged_kernels.PAGED_FUSED_ROPE = True
cpu = torch.device("cpu")
for dtype in (torch.float32, torch.float16):  # the interpreter's 16-bit dots work in fp16, not in bf16
    v = paged_kernels.check(cpu, dtype, 14, 2, 64)
    print(dtype, v["paged_attention"], v["rope_and_cache_paged"], v["paged_rope_attention"], v["paged_attention_split"])
"""


def test_paged_kernels_the_fused_rope_attention_and_split_attention_agree_with_torch_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", PAGED], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["torch.float32"] + ["None"] * 4 + ["torch.float16"] + ["None"] * 4


SAMPLER = """
import torch
from masrl.engines import sample_kernel
cpu = torch.device("cpu")
for dtype in (torch.float32, torch.bfloat16):
    print(dtype, sample_kernel.check(cpu, dtype)["sample"])
"""


def test_fused_sampler_is_the_inverse_cdf_draw_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SAMPLER], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["torch.float32", "None", "torch.bfloat16", "None"]
