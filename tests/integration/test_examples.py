"""The examples run as a user would run them: from a config, through the CLI."""

import json
import subprocess
import sys

import yaml
from tinycfg import ROOT, tiny_config


def test_custom_workflow_and_reward_train_through_the_cli(tmp_path):
    data = yaml.safe_load((ROOT / "examples" / "custom_workflow.yaml").read_text())
    data = tiny_config(data, tmp_path / "run", steps=1)
    data["rewards"] = yaml.safe_load((ROOT / "examples" / "custom_workflow.yaml").read_text())["rewards"] + [
        {"type": "helpers:agent_hash_reward"}]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = {"PYTHONPATH": f"{ROOT / 'examples'}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin",
           "MASRL_CACHE_DIR": __import__("masrl.data.cache", fromlist=["x"]).cache_dir().as_posix()}
    out = subprocess.run([sys.executable, "-m", "masrl.cli", "train", str(cfg)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    trace = json.loads((tmp_path / "run" / "traces.jsonl").read_text().splitlines()[0])
    assert trace["calls"][0]["agent"] == "solver"
    parts = trace["calls"][0]["reward_parts"]
    assert {"outcome", "format", "brevity", "text_hash"} <= set(parts)
    # random outputs are no arithmetic: the calculator tool fails and the failure is on the trace
    assert trace["tool_calls"] and trace["tool_calls"][0]["error"]
    assert trace["metrics"]["tool_failures"] >= 1


def test_calculator_is_not_eval():
    sys.path.insert(0, str(ROOT / "examples"))
    from custom_workflow import calculator

    assert calculator("3 + 4 * 2") == 11
    import pytest

    from masrl.tools.base import ToolUseError

    with pytest.raises(ToolUseError):
        calculator("__import__('os').system('true')")
