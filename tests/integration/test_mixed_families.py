"""Agents on policies of different model families and tokenizers in one run: each worker renders
prompts with its own chat template and tokenizer; traces stay text; both policies train."""

import asyncio

from tinycfg import prepared_trainer, tiny_config


def test_llama_and_qwen2_policies_with_different_tokenizers_train_together(tmp_path):
    data = tiny_config("math/team_two_policies", tmp_path, steps=2)
    data["policies"]["writer"]["model"] = "tiny-random-qwen2"
    tr, workers, before = prepared_trainer(data, tmp_path)
    llama, qwen = workers["reasoner"], workers["writer"]
    assert llama is not qwen
    assert type(llama.held.core).__name__.startswith("Llama") and type(qwen.held.core).__name__.startswith("Qwen2")
    assert len(llama.held.tokenizer) != len(qwen.held.tokenizer)
    msgs = [{"role": "user", "content": "Ana has 3 pens."}]
    assert qwen.held.tokenizer.decode(qwen.sampler.render(msgs)).startswith("<|user|>Ana has 3 pens.<|end|><|assistant|>")
    assert "<|im_start|>user" in llama.held.tokenizer.decode(llama.sampler.render(msgs))
    for _ in range(2):
        rec = asyncio.run(tr.train_step())
        assert rec["rollout"]["failed"] == 0 and set(rec["policies"]) == {"reasoner", "writer"}
    for p, w in workers.items():
        assert w.fingerprint(p) != before[p]  # both trained
    trace = tr.last_traces[0]
    by_agent = {c.agent: c for c in trace.calls}
    assert by_agent["refiner"].policy == "writer" and isinstance(by_agent["refiner"].completion, str)
