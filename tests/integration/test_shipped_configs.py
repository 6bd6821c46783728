"""Every shipped config trains as shipped, through the CLI.

Only the model, the step count and the sizes are overridden (tiny-random, one step, two tasks of two
samples, short completions); the data section, rewards, workflow, algorithm and mapping are the
files' own. This is what caught the code configs: their held-out questions removed every training
task, and no test built a shipped config's data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from masrl.cli import main
from masrl.families import shipped_configs

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = list(shipped_configs().values()) + sorted((ROOT / "examples").glob("*.yaml"))


def size_overrides(path: Path) -> list[str]:
    data = yaml.safe_load(path.read_text())
    out = ["model=tiny-random", "train.steps=1", "train.eval_before=false", "train.eval_after=false",
           "train.save_every=1", "rollout.tasks_per_step=2", "rollout.samples_per_task=2",
           "algorithm.micro_batch_size=4"]
    out += [f"agents.{a}.max_new_tokens=8" for a in data["agents"]]
    out += [f"policies.{p}.model=tiny-random" for p, spec in data["policies"].items() if "model" in (spec or {})]
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.parent.name}/{p.stem}" if p.parent.name == "configs" else p.stem
                                           for p in CONFIGS])
def test_a_shipped_config_reaches_step_one_as_shipped(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)  # configs name their graph files relative to the repository
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # as its header says: PYTHONPATH=examples
    run = tmp_path / "run"
    rc = main(["train", str(path.relative_to(ROOT)), *size_overrides(path), f"output_dir={run}"])
    err = capsys.readouterr().err
    assert rc == 0, err
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    first = next(s for s in steps if s.get("step") == 1 and "rollout" in s)
    assert first["rollout"]["traces"] == 4 and first["rollout"]["failed"] == 0
    assert (run / "checkpoints" / "step_000001" / "state.json").is_file()
    shipped = yaml.safe_load(path.read_text()).get("data", {})
    resolved = yaml.safe_load((run / "config.yaml").read_text())["data"]
    for split in ("train", "eval"):  # the run used the file's data section, untouched
        for key, value in shipped.get(split, {}).items():
            assert resolved[split][key] == value, (split, key)
