"""VLLMEngine: the Engine interface over vLLM (``rollout.engine: vllm``; ``pip install 'masrl[vllm]'``).

vLLM holds its own copy of the weights, made from the trainer's model at start (written once to a
temporary directory, so random-weight and converted models work as well as hub directories), and
runs in the trainer's process (vLLM's in-process engine core), so new weights reach it without
a restart or a copy through a socket:

* a full model: after every update, the trainer's parameters go to vLLM's in-place
  ``reload_weights`` (which fuses q/k/v and gate/up and redoes the backend's weight processing,
  such as the CPU backend's repacking), then its prefix cache is reset;
* LoRA: every adapter is served at once (``enable_lora``, one ``LoRARequest`` per row); after an
  update the changed adapters are written to new directories under new ids, so vLLM loads the new
  weights and never serves a cached old copy.

After each update ``stale_weights`` reads back what vLLM will sample from (each adapter's new directory; a full
model's unfused weights from vLLM's own copy) and names what differs from the trainer's, which fails the step.

Logprobs are vLLM's ``processed_logprobs``: the sampled token's log-probability after temperature
(masrl's convention) and after top-p when ``top_p < 1`` (vLLM renormalises over the nucleus; masrl's
own engines report it before top-p); greedy rows under softmax(logits), as masrl's engines. Sampling
is seeded per row when the request has a seed, but vLLM's random stream is its own: the same seed
gives other tokens than masrl's engines do.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from masrl.engines.defaults import EngineDefaults
from masrl.messages import GenOutput, GenRequest


def no_flashinfer() -> None:
    """Without FlashInfer (optional for vLLM's default FlashAttention backend), vLLM 0.24's sampler must be told not to
    import it: its check imports FlashInfer's attention backend unguarded."""
    if importlib.util.find_spec("flashinfer") is None:
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")


def vllm_memory(model, device: str, kv_fraction: float) -> dict:
    """vLLM's memory settings for ``rollout.gpu_memory_utilization`` (the fraction of the device the KV cache takes,
    as for the paged engine): the KV bytes as ``kv_cache_memory_bytes``, and a ``gpu_memory_utilization`` (which vLLM
    then only checks against the free memory at start) of the weights, the cache and 2 GiB for activations and graphs,
    so that vLLM starts beside a trainer that already holds memory."""
    total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    kv = int(kv_fraction * total)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"kv_cache_memory_bytes": kv, "gpu_memory_utilization": min(0.95, (kv + weights + 2 * 2**30) / total)}


def _seed(seed: int | None) -> int | None:
    """A call's seed as vLLM takes it (a C long: the trainer's 64-bit call seeds overflowed it)."""
    return None if seed is None else seed % 2**63


def _read_back(name: str, device: str) -> bool:
    """The parameters ``stale_weights`` reads back from a full model in vLLM: those it keeps under the trainer's names
    and as loaded. The norms everywhere; on a GPU also the unfused output projections (attention's o_proj, the MLP's
    down_proj), which vLLM's CPU backend repacks."""
    return name.endswith("norm.weight") or (device.startswith("cuda") and name.endswith(("o_proj.weight",
                                                                                         "down_proj.weight")))


def _every_61st_row(p: torch.Tensor) -> torch.Tensor:
    return p[::61] if p.dim() == 2 else p


def _core(model):
    return model.get_base_model() if hasattr(model, "peft_config") else model


class VLLMEngine(EngineDefaults):
    def __init__(self, model, tokenizer, stop_ids: list[int], *, device: str, seed: int = 0, max_model_len: int = 4096,
                 gpu_memory_utilization: float = 0.04, max_batch_size: int = 256, kv_cache_gb: int = 1,
                 cuda_graphs: bool = True):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights are handed over directly
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(kv_cache_gb))))
        no_flashinfer()
        from vllm import LLM

        self.model, self.tok = model, tokenizer
        self.device = device
        self.stop_ids = [int(s) for s in stop_ids]
        self.is_peft = hasattr(model, "peft_config")
        self.dir = Path(tempfile.mkdtemp(prefix="masrl-vllm-"))
        core = _core(model)
        with torch.no_grad():
            if self.is_peft:  # the frozen base, without LoRA layers
                with model.disable_adapter():
                    state = {k.replace("base_layer.", ""): v for k, v in core.state_dict().items() if "lora_" not in k}
                core.save_pretrained(self.dir / "base", state_dict=state)
            else:
                core.save_pretrained(self.dir / "base")
        tokenizer.save_pretrained(self.dir / "base")
        dtype = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}[
            next(core.parameters()).dtype]
        kwargs = dict(model=str(self.dir / "base"), dtype=dtype, seed=seed, max_model_len=max_model_len,
                      max_num_seqs=max_batch_size, logprobs_mode="processed_logprobs",
                      enforce_eager=not (device.startswith("cuda") and cuda_graphs))
        if device.startswith("cuda"):
            kwargs.update(vllm_memory(core, device, gpu_memory_utilization))
        self._adapters = list(model.peft_config) if self.is_peft else []
        if self._adapters:
            kwargs.update(enable_lora=True, max_loras=len(self._adapters),
                          max_lora_rank=max(max(8, model.peft_config[a].r) for a in self._adapters))
        self.llm = LLM(**kwargs)
        self.version = {a: 0 for a in self._adapters}
        self.lora_ids: dict[str, int] = {}
        self._paths: dict[str, str] = {}  # adapter -> the directory of its current version
        self._next_id = 1
        for a in self._adapters:
            self._write_adapter(a)
        self.stats = {"weight_syncs": 0, "adapter_writes": len(self._adapters)}

    # -- weights ---------------------------------------------------------------------------------
    def _write_adapter(self, name: str) -> None:
        path = self.dir / f"lora-{name}-{self.version[name]}"
        self.model.save_pretrained(str(path), selected_adapters=[name])
        src = path / name if (path / name).is_dir() else path  # PEFT nests non-default adapters
        old = self.lora_ids.get(name)
        self.lora_ids[name] = self._next_id
        self._next_id += 1
        self._paths[name] = str(src)
        if old is not None:
            try:
                self.llm.llm_engine.remove_lora(old)
            except Exception:  # not loaded yet: nothing to drop
                pass

    def weights_updated(self, policies: list[str] | None = None) -> None:
        if self.is_peft:
            for name in (policies or self._adapters):
                if name in self.version:
                    self.version[name] += 1
                    self._write_adapter(name)
                    self.stats["adapter_writes"] += 1
            return
        weights = [(n, p.detach()) for n, p in _core(self.model).named_parameters()]

        def load(worker, weights=weights):  # in place, re-running the loader's post-processing (CPU repacking)
            worker.model_runner.reload_weights(weights_iterator=iter(weights))
            return len(weights)

        self.llm.collective_rpc(load)
        self.llm.reset_prefix_cache()
        self.stats["weight_syncs"] += 1

    def stale_weights(self) -> list[str]:
        """What vLLM would sample from that is not the live model. LoRA: each adapter's directory that the next
        ``LoRARequest`` names, read back from disk and compared exactly with the live adapter; a full model: the
        parameters vLLM keeps as loaded (``_read_back``), every 61st row of a matrix, read from vLLM's own copy."""
        if self.is_peft:
            from peft import get_peft_model_state_dict
            from safetensors.torch import load_file

            stale = []
            for name in self._adapters:
                saved = load_file(os.path.join(self._paths[name], "adapter_model.safetensors"))
                live = get_peft_model_state_dict(self.model, adapter_name=name)
                if saved.keys() != live.keys() or not all(
                        torch.equal(saved[k], live[k].detach().to("cpu", saved[k].dtype)) for k in saved):
                    stale.append(f"adapter '{name}' at {self._paths[name]}")
            return stale

        dev = self.device

        def rows(worker):
            return {n: _every_61st_row(p).detach().cpu()
                    for n, p in worker.model_runner.model.named_parameters() if _read_back(n, dev)}

        served = self.llm.collective_rpc(rows)[0]
        live = {n: p for n, p in _core(self.model).named_parameters() if _read_back(n, dev)}
        if not served or served.keys() != live.keys():
            return [f"vLLM's weights were not read back (it holds {sorted(served)[:3]}, the model {sorted(live)[:3]})"]
        return [n for n, p in live.items()
                if not torch.equal(served[n], _every_61st_row(p).detach().to("cpu", served[n].dtype))]

    def adapters(self) -> list[str]:
        return list(self._adapters)

    def memory(self) -> dict[str, int]:
        return {}  # vLLM budgets its own memory (gpu_memory_utilization)

    def release(self) -> None:  # vLLM keeps its own memory; sleep mode is a GPU feature left to a later step
        return None

    # -- generation ------------------------------------------------------------------------------
    def _generate(self, requests: list[GenRequest]) -> list[GenOutput]:
        if not requests:
            return []
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        prompts, params, loras = [], [], []
        for r in requests:
            s = r.sampling
            prompts.append(TokensPrompt(prompt_token_ids=list(r.prompt_ids)))
            params.append(SamplingParams(
                temperature=s.temperature, top_p=s.top_p, max_tokens=r.max_new_tokens, seed=_seed(r.seed), logprobs=0,
                stop=list(s.stop) if s.stop else None, include_stop_str_in_output=True, ignore_eos=s.ignore_eos,
                stop_token_ids=[] if s.ignore_eos else self.stop_ids, skip_special_tokens=True))
            # a name per version: vLLM tells LoRARequests apart by name, and served adapter a's old weights under
            # its new id when the name stayed "a" (tests/gpu/test_vllm_gpu.py)
            loras.append(LoRARequest(f"{r.adapter}@{self.version[r.adapter]}", self.lora_ids[r.adapter],
                                     self._paths[r.adapter])
                         if r.adapter else None)
        if self.is_peft and any(lr is None for lr in loras) and any(lr is not None for lr in loras):
            # rows without an adapter go in a call of their own: vLLM 0.32's CPU backend gave a plain row
            # in a batch with LoRA rows the previous row's adapter (tests/integration/test_vllm_engine.py)
            plain = [i for i, lr in enumerate(loras) if lr is None]
            lora = [i for i, lr in enumerate(loras) if lr is not None]
            outs = [None] * len(requests)
            for rows, lr in ((plain, None), (lora, [loras[i] for i in lora])):
                got = self.llm.generate([prompts[i] for i in rows], [params[i] for i in rows], lora_request=lr,
                                        use_tqdm=False)
                for i, o in zip(rows, got):
                    outs[i] = o
        else:
            outs = self.llm.generate(prompts, params, lora_request=loras if self.is_peft else None, use_tqdm=False)
        results = []
        for out in outs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            lps = [float(step[t].logprob) for step, t in zip(o.logprobs or [], ids)]
            results.append(GenOutput(ids, lps, o.text, "length" if o.finish_reason == "length" else "stop"))
        return results

    def __del__(self):
        shutil.rmtree(getattr(self, "dir", ""), ignore_errors=True)
