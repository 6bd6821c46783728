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
from masrl.engines.paged.kernels import common as kernels
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
        assert set(line.split(" ", 1)[1].strip("{}").replace("'", "").replace(": None", "").split(", ")) == {
            "rms_norm", "silu_mul"}
    assert lines[2] == "training {'rope': True, 'swiglu': True, 'token_logprobs': True}"


PAGED = """
import torch
from masrl.engines.paged.kernels import paged as paged_kernels
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
from masrl.engines.paged.kernels import sample as sample_kernel
cpu = torch.device("cpu")
for dtype in (torch.float32, torch.bfloat16):
    print(dtype, sample_kernel.check(cpu, dtype)["sample"])
"""


def test_fused_sampler_is_the_inverse_cdf_draw_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", SAMPLER], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["torch.float32", "None", "torch.bfloat16", "None"]


ENGINE = """
import json, torch
from masrl.config import SamplingParams
from masrl.engines.paged.kernels import common as kernels, paged as paged_kernels
from masrl.engines.paged import PagedEngine
from masrl.messages import GenRequest
from masrl.models import load_model

kernels.available = lambda dev: True  # the engine takes its Triton kernels on a CPU (run by the interpreter)
paged_kernels.PAGED_LONG_KEYS = 24  # so that short prompts decode in the long length class, keys split in runs
paged_kernels.PAGED_SPLIT_PROGRAMS = 16
model, tok = load_model("tiny-random", seed=0)
g = torch.Generator().manual_seed(0)
ps = [torch.randint(10, 400, (n,), generator=g).tolist() for n in (30, 47)]
req = lambda p, n: GenRequest(list(p), SamplingParams(temperature=0.0, max_new_tokens=n))
real, splits, out = paged_kernels.paged_attention, [], {}
for fused in (True, False):
    eng = PagedEngine(model, tok, [2], device="cpu", kv_blocks=256, block_size=4, graph_prefill=True,
                      fused_kernels=fused)
    paged_kernels.paged_attention = lambda *a, **k: splits.append(k.get("splits", 1)) or real(*a, **k)
    first = eng.generate([req(p, 5) for p in ps])
    nxt = eng.generate([req(p + o.completion_ids + [11, 12, 13], 4) for p, o in zip(ps, first)])
    out[str(fused)] = {"tokens": [o.completion_ids for o in first + nxt], "logprobs": [o.logprobs for o in first + nxt],
                       "kernels": eng.stats["fused_kernels"], "row_prefills": eng.stats["row_prefills"]}
out["splits"] = sorted(set(splits))
print(json.dumps(out))
"""


def test_the_paged_engine_with_its_kernels_splits_long_rows_and_keeps_every_token_in_the_interpreter():
    """The paged engine on its Triton kernels (the interpreter, fp32): first turns and next turns prefilled as
    token rows, in the long length class, so each row's keys are split into runs (``paged_splits``): the same
    tokens as the engine on torch ops and logprobs within 1e-5 (dropping one key of each split row moves them
    by 1e-3 to 1e-2 here)."""
    import json

    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-c", ENGINE], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    fused, plain = out["True"], out["False"]
    assert "paged_attention_split" in fused["kernels"] and plain["kernels"] == []
    assert max(out["splits"]) > 1 and fused["row_prefills"] > 0
    assert fused["tokens"] == plain["tokens"]
    gaps = [abs(a - b) for x, y in zip(fused["logprobs"], plain["logprobs"]) for a, b in zip(x, y)]
    assert len(gaps) == 18 and max(gaps) < 1e-5
