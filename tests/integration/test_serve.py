"""masrl serve: a config's agents (a checkpoint's weights) behind the OpenAI-compatible API, reached
with the official openai client from another process."""

import pytest
import yaml
from openai import OpenAI
from tinycfg import start_serve, tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import train

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)


def test_serve_answers_the_openai_client_from_a_checkpoint(tmp_path):
    data = tiny_config("math/team_shared", tmp_path / "run", steps=1)
    train(load_config(data=data))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc, base, seen = start_serve(cfg, "--checkpoint", str(tmp_path / "run"))
    url = f"{base}/v1"
    try:
        assert any("serving the weights of" in x and "step_000001" in x for x in seen)
        client = OpenAI(base_url=url, api_key="unused")
        assert sorted(m.id for m in client.models.list().data) == ["finalizer", "refiner", "solver", "verifier"]
        out = client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "2 + 2?"}],
                                             max_tokens=5, temperature=0)
        again = client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "2 + 2?"}],
                                               max_tokens=5, temperature=0)
        assert out.choices[0].message.content == again.choices[0].message.content  # greedy, as asked
        assert out.usage.completion_tokens <= 5
        text = client.completions.create(model="verifier", prompt="The sum of 2 and 2 is", max_tokens=3)
        assert text.choices[0].text and text.object == "text_completion"
        # a streaming client (verifiers' harnesses, LangGraph) reads the same greedy answer as chunks
        chunks = list(client.chat.completions.create(model="solver", messages=[{"role": "user", "content": "2 + 2?"}],
                                                     max_tokens=5, temperature=0, stream=True,
                                                     stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == out.choices[0].message.content
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
        assert chunks[-1].usage.completion_tokens == out.usage.completion_tokens
        raw = "".join(c.choices[0].text for c in client.completions.create(
            model="verifier", prompt="The sum of 2 and 2 is", max_tokens=3, temperature=0, stream=True) if c.choices)
        assert raw == client.completions.create(model="verifier", prompt="The sum of 2 and 2 is", max_tokens=3,
                                                temperature=0).choices[0].text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
