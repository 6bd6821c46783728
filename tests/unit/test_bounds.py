"""Settings, files and names stay in their bounds: a number that is infinite, NaN or past its range, a run
name that is not one path component, an output_dir that cannot hold a run are one-line errors naming the
key; JSONL is split by JSON's own line rule."""

from __future__ import annotations

import json

import pytest

from masrl.config import load_config
from masrl.errors import ConfigError
from masrl.families import config_path

SOLVER = config_path("math/solver")


@pytest.mark.parametrize("override, key", [
    ("rollout.reward_timeout_s=.inf", "rollout.reward_timeout_s"),
    ("rollout.reward_timeout_s=1e10", "rollout.reward_timeout_s"),
    ("rollout.max_wait_ms=.inf", "rollout.max_wait_ms"),
    ("rollout.call_timeout_s=.nan", "rollout.call_timeout_s"),
    ("sandbox.wall_s=-1", "sandbox.wall_s"),
    ("policies.solver.optim.lr=.inf", "policies.solver.optim.lr"),
    ("name=../../x", "name"),
    ("name=", "name"),
    ("name=a/b", "name"),
    ("output_dir=", "output_dir"),
])
def test_a_value_out_of_bounds_is_an_error_naming_its_key(override, key):
    with pytest.raises(ConfigError) as info:
        load_config(SOLVER, [override])
    assert f"`{key}`" in str(info.value)


def test_an_output_dir_that_cannot_hold_a_run_is_one_line(tmp_path):
    from masrl.driver.run.rundir import make_run_dir

    (tmp_path / "file").write_text("x")
    for bad, says in ((tmp_path / "file", "that is a file"), (tmp_path / "file" / "sub", "cannot write the run there")):
        with pytest.raises(ConfigError, match=says) as info:
            make_run_dir(bad)
        assert "output_dir" in str(info.value) and "\n" not in str(info.value)
    make_run_dir(tmp_path / "new" / "run")
    assert (tmp_path / "new" / "run").is_dir() and not any((tmp_path / "new" / "run").iterdir())


def test_jsonl_rows_may_hold_unicode_line_separators(tmp_path):
    from masrl.data.loader import read_rows

    rows = [{"question": "a\u2028b", "answer": "1"}, {"question": "c\u2029d\u0085e", "answer": "2"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    got = read_rows(path)
    assert [r["question"] for r in got] == ["a\u2028b", "c\u2029d\u0085e"]
