"""Tiny-random end-to-end training for every shipped config, resume, and the CLI."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from tinycfg import ROOT, tiny_config

from masrl.config import load_config
from masrl.driver.run import rundir as ckpt
from masrl.driver.run.loop import train
from masrl.errors import MasrlError
from masrl.families import shipped_configs

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

SHIPPED = list(shipped_configs())


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), e.get("PYTHONPATH", "")])
    return e


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_config_trains_end_to_end(name, tmp_path):
    data = tiny_config(name, tmp_path, steps=2)
    data["train"]["eval_after"] = True
    cfg = load_config(data=data)
    results = train(cfg)
    all_lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lines = [r for r in all_lines if "rollout" in r]
    assert [r["step"] for r in lines] == [1, 2]
    assert [(r["step"], r["eval"]) for r in all_lines if "eval" in r] == [(2, "after")]
    for rec in lines:
        assert rec["rollout"]["failed"] == 0
        if cfg.workflow.name in ("textarena", "openspiel", "pettingzoo"):  # a game can end before a seat moves
            # (tiny-random's moves are invalid)
            assert set(rec["rollout"]["agents"]) <= set(cfg.agents) and rec["rollout"]["agents"]
        else:
            assert set(rec["rollout"]["agents"]) == set(cfg.agents)
        called = {cfg.agents[a].policy for a in rec["rollout"]["agents"]}
        for p, pc in cfg.policies.items():
            if pc.frozen or p not in called:  # a fixed opponent never trains; a seat that never moved has nothing
                continue
            m = rec["policies"][p]
            assert m["trained_tokens"] > 0 and m["optimizer_steps"] >= 1
            assert all(v == v for v in m.values())  # no NaN
    assert ckpt.latest_checkpoint(tmp_path / "checkpoints").name == "step_000002"
    assert (tmp_path / "config.yaml").is_file() and (tmp_path / "traces.jsonl").is_file()
    assert results["after"]["traces"] == 3
    trace = json.loads((tmp_path / "traces.jsonl").read_text().splitlines()[0])
    assert trace["calls"] and all("completion" in c for c in trace["calls"])


def test_resume_continues_from_the_saved_step(tmp_path):
    cfg = load_config(data=tiny_config("math/team_two_policies", tmp_path, steps=2))
    train(cfg)
    saved = ckpt.latest_checkpoint(tmp_path / "checkpoints")
    assert saved.name == "step_000002"
    # a plain re-run refuses to overwrite
    from masrl.errors import MasrlError

    with pytest.raises(MasrlError, match=f"continue it with masrl resume {tmp_path}"):
        train(cfg)
    cfg3 = load_config(data=tiny_config("math/team_two_policies", tmp_path, steps=3))
    from masrl.driver.run.loop import Trainer

    tr = Trainer(cfg3, run_dir=tmp_path)
    tr.prepare(resume=True)
    assert tr.step == 2
    # weights and optimizer state came back
    import torch
    from safetensors.torch import load_file

    w = tr.rt.workers[0]
    name = w.policy_names[0]
    saved_sd = load_file(str(saved / name / "model.safetensors"))
    live = w.held.model.state_dict()
    assert all(torch.equal(saved_sd[k], live[k]) for k in saved_sd)
    assert w.updater.optimizers[name].state_dict()["adamw"]["state"], "optimizer state was not restored"
    import asyncio

    asyncio.run(tr.run())
    steps = [r["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines() if "rollout" in (r := json.loads(x))]
    assert steps == [1, 2, 3]
    assert ckpt.latest_checkpoint(tmp_path / "checkpoints").name == "step_000003"


def test_resume_without_a_checkpoint_starts_over_without_duplicate_lines(tmp_path, monkeypatch):
    from masrl.driver.run.loop import Trainer

    cfg = load_config(data=tiny_config("math/solver", tmp_path, steps=2, train__save_every=0,
                                       train__eval_before=True, train__eval_after=True))

    def dies(self):
        raise RuntimeError("killed before its first checkpoint")

    with monkeypatch.context() as m:  # an attempt that logs both steps, then dies saving
        m.setattr(Trainer, "save_checkpoint", dies)
        with pytest.raises(RuntimeError, match="killed"):
            train(cfg)
    assert ckpt.latest_checkpoint(tmp_path / "checkpoints") is None
    with pytest.raises(MasrlError, match="earlier run's metrics.jsonl .* masrl resume "):  # it would append to them
        train(cfg)
    train(cfg, resume=True)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "rollout" in r] == [1, 2]
    assert [r["eval"] for r in lines if "eval" in r] == ["before", "after"]


def run_cli(args, tmp_path, **kw):
    return subprocess.run([sys.executable, "-m", "masrl.cli", *args], cwd=tmp_path, env=env(), capture_output=True,
                          text=True, timeout=300, **kw)


def test_cli_bad_config_fails_fast_with_one_message(tmp_path):
    bad = tmp_path / "bad.yaml"
    data = tiny_config("math/solver", tmp_path / "run")
    data["algorithm"]["klcoef"] = 0.1
    bad.write_text(yaml.safe_dump(data))
    t0 = time.time()
    out = run_cli(["train", str(bad)], tmp_path)
    assert out.returncode == 2
    assert "unknown key `algorithm.klcoef`" in out.stderr and "kl_coef" in out.stderr
    assert "Traceback" not in out.stderr
    assert time.time() - t0 < 60
    out = run_cli(["train", str(bad), "algorithm.klcoef=0", "model=/nope"], tmp_path)
    assert out.returncode == 2
    data["algorithm"].pop("klcoef")
    bad.write_text(yaml.safe_dump(data))
    out = run_cli(["train", str(bad), "model=/no/such/dir"], tmp_path)
    assert out.returncode == 2 and "model '/no/such/dir' does not exist" in out.stderr


def test_cli_train_then_eval_checkpoint(tmp_path):
    cfgfile = tmp_path / "c.yaml"
    cfgfile.write_text(yaml.safe_dump(tiny_config("math/solver", tmp_path / "run", steps=1)))
    out = run_cli(["train", str(cfgfile)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "step 1/1" in out.stdout
    out = run_cli(["eval", str(cfgfile), "--checkpoint", str(tmp_path / "run")], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "evaluating" in out.stdout and "step_000001" in out.stdout and "held-out" in out.stdout
    out = run_cli(["eval", str(cfgfile), "--checkpoint", str(tmp_path / "run"), f"output_dir={tmp_path / 'ev'}"], tmp_path)
    summary = json.loads((tmp_path / "ev" / "eval.json").read_text())
    assert out.returncode == 0 and summary["traces"] == 3 and "solver" in summary["agents"]
    out = run_cli(["eval", str(cfgfile), "--checkpoint", str(tmp_path / "nothing")], tmp_path)
    assert out.returncode == 2 and "no checkpoint there" in out.stderr


def test_ctrl_c_leaves_the_last_checkpoint_loadable(tmp_path):
    cfgfile = tmp_path / "c.yaml"
    cfgfile.write_text(yaml.safe_dump(tiny_config("math/team_shared", tmp_path / "run", steps=500)))
    out_f, err_f = open(tmp_path / "out.log", "w"), open(tmp_path / "err.log", "w")  # files: a full pipe cannot block it
    proc = subprocess.Popen([sys.executable, "-m", "masrl.cli", "train", str(cfgfile)], cwd=tmp_path, env=env(),
                            stdout=out_f, stderr=err_f, text=True)
    root = tmp_path / "run" / "checkpoints"
    deadline = time.time() + 240
    while time.time() < deadline and len(list(root.glob("step_*"))) < 2:
        time.sleep(0.2)
    assert len(list(root.glob("step_*"))) >= 2, "training did not checkpoint in time"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    out_f.close()
    err_f.close()
    err = (tmp_path / "err.log").read_text()
    assert proc.returncode == 130, err
    assert "interrupted" in err and f"continue from it with: masrl resume {tmp_path / 'run'}" in err, err
    latest = ckpt.latest_checkpoint(root)
    out = run_cli(["eval", str(cfgfile), "--checkpoint", str(latest)], tmp_path)
    assert out.returncode == 0, out.stderr
    assert not list(root.glob("*.tmp")) or latest is not None
