"""Every CLI command checks its paths before any model loads, and creates the folders it writes into."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from masrl.cli import main
from masrl.families import config_path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(config_path("math/team_shared"))


def run(capsys, *argv) -> tuple[int, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_data_commands_create_the_folder_they_write_into(tmp_path, capsys):
    target = tmp_path / "new_dir" / "deeper" / "p.jsonl"
    rc, out = run(capsys, "data", "arithmetic", "--out", str(target), "--n", "5")
    assert rc == 0, out
    assert len(target.read_text().splitlines()) == 5
    rc, out = run(capsys, "data", "arithmetic", "--out", str(tmp_path), "--n", "5")
    assert rc == 2 and "that is a directory" in out and "--out" in out
    # a family's own command (families.qa's DATA_COMMANDS), registered without the CLI naming the family
    rc, out = run(capsys, "data", "qa-world", "--out", str(tmp_path / "world"), "--docs", "40", "--questions", "6")
    assert rc == 0, out
    assert len((tmp_path / "world" / "questions.jsonl").read_text().splitlines()) == 6


@pytest.mark.parametrize("argv, says", [
    (["eval", CONFIG, "--checkpoint", "/no/such/dir"],
     "--checkpoint /no/such/dir: no checkpoint there (no such file or directory)"),
    (["eval", CONFIG, "--checkpoint", "{tmp}"], "no checkpoint there"),
    (["train", "/no/such/config.yaml"], "config file '/no/such/config.yaml' does not exist"),
    (["report", "/no/such/run"], "run directory '/no/such/run' does not exist"),
    (["retriever", "serve", "--corpus", "/no/such/corpus.jsonl"], "--corpus /no/such/corpus.jsonl: no such file"),
    (["retriever", "index", "--corpus", "{tmp}"], "(it is a directory)"),
    (["retriever", "query", "who"], "give --endpoint URL"),
])
def test_bad_paths_are_refused_before_anything_loads(argv, says, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    rc, out = run(capsys, *argv)
    assert rc == 2 and says in out, out
    assert "loading" not in out  # no model, no index


def test_report_writes_into_a_new_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "rollout": {"traces": 1}}) + "\n")
    out = tmp_path / "pages" / "r.html"
    rc, text = run(capsys, "report", str(run_dir), "--out", str(out))
    assert rc == 0, text
    assert out.read_text().startswith("<!doctype html>")
