"""masrl serve: a config's agents (a checkpoint's weights) behind the OpenAI-compatible API, reached
with the official openai client from another process."""

import os
import re
import subprocess
import sys
import time

import yaml
from openai import OpenAI
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import train


def _start(cfg_path, *extra):
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the config's test rewards live there
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "serve", str(cfg_path), "--port", "0", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
        if m:
            return proc, m.group(1), seen
    proc.kill()
    raise AssertionError("masrl serve did not come up:\n" + "".join(seen))


def test_serve_answers_the_openai_client_from_a_checkpoint(tmp_path):
    data = tiny_config("math_team_shared", tmp_path / "run", steps=1)
    train(load_config(data=data))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc, url, seen = _start(cfg, "--checkpoint", str(tmp_path / "run"))
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
    finally:
        proc.terminate()
        proc.wait(timeout=30)
