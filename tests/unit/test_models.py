import pytest

from masrl.errors import ModelError
from masrl.models import TINY_RANDOM, resolve_model, stop_token_ids


def test_resolve_aliases_dirs_and_gguf(tmp_path):
    assert resolve_model("smollm2-135m-instruct").kind == "alias"
    assert resolve_model(TINY_RANDOM).kind == "alias"
    d = tmp_path / "m"
    d.mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model(str(d))
    (d / "config.json").write_text("{}")
    assert resolve_model(str(d)).kind == "hf_dir"
    g = tmp_path / "x.gguf"
    g.write_bytes(b"GGUF")
    assert resolve_model(str(g)).kind == "gguf"


def test_missing_model_says_what_to_use():
    with pytest.raises(ModelError, match="policies.p.model: model '/nope' does not exist. Use one of the aliases"):
        resolve_model("/nope", key="policies.p.model")


def test_tiny_random_is_seeded_and_uses_the_smollm2_tokenizer(tiny):
    import torch

    from masrl.models import load_model

    model, tok = tiny
    again, _ = load_model(TINY_RANDOM, seed=0)
    other, _ = load_model(TINY_RANDOM, seed=1)
    p0, p1, p2 = (next(m.parameters()) for m in (model, again, other))
    assert torch.equal(p0, p1) and not torch.equal(p0, p2)
    assert model.config.vocab_size == len(tok) and tok.padding_side == "left"
    assert tok.convert_tokens_to_ids("<|im_end|>") in stop_token_ids(tok, model)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
