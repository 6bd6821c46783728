"""Plugin estimators of each kind train a team step from config, with no library edit."""

import asyncio
import sys
from pathlib import Path

import pytest
from tinycfg import prepared_trainer, tiny_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))


@pytest.mark.parametrize("name", ["custom_estimator:tail_weighted", "custom_estimator:td0"])
def test_a_plugin_estimator_trains_a_team_step(name, tmp_path):
    data = tiny_config("math/team_shared", tmp_path, steps=1)
    data["algorithm"].update({"advantage": name})
    tr, workers, before = prepared_trainer(data, tmp_path)
    assert bool(workers["shared"].held.value_heads) == name.endswith("td0")  # a value head only where values are read
    rec = asyncio.run(tr.train_step())
    m = rec["policies"]["shared"]
    assert m["optimizer_steps"] == 1 and m["adv_abs_mean"] > 0
    assert ("value_loss" in m) == name.endswith("td0")
    assert workers["shared"].fingerprint("shared") != before["shared"]
