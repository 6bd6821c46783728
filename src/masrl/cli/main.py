"""``masrl`` command line. Heavy imports happen inside the commands."""

from __future__ import annotations

import argparse
import json
import sys

from masrl.errors import MasrlError


def _interrupt_handler(grace_s: float = 20.0):
    """First Ctrl-C: raise KeyboardInterrupt and let the run unwind (checkpoints are written
    atomically, so the last one stays loadable); if unwinding takes longer than ``grace_s``, or
    on a second Ctrl-C, exit at once."""
    import os
    import threading

    state = {"fired": False}

    def handler(signum, frame):
        if state["fired"]:
            os._exit(130)
        state["fired"] = True
        timer = threading.Timer(grace_s, lambda: os._exit(130))
        timer.daemon = True
        timer.start()
        raise KeyboardInterrupt

    return handler


def _config_file(arg: str):
    """The YAML file a command reads: a path, or a shipped config's name (``math/solver``)."""
    from masrl.families import config_path

    return config_path(arg)


def _target(arg: str, overrides: list[str]):
    """What a command acts on: a run directory (its own ``config.yaml``, ``overrides`` on top) or a
    config (a YAML file or a shipped config's name). Returns ``(config, RunDir or None)``."""
    from pathlib import Path

    from masrl.config import load_config
    from masrl.driver.run.rundir import RunDir

    run = RunDir.find(arg)
    if run is not None:
        return run.config(overrides), run
    if Path(arg).is_dir():
        raise MasrlError(f"'{arg}' is a folder but not a run (it holds no config.yaml); give a run directory "
                         f"(runs/<name>), a YAML config or a shipped config's name (`masrl configs` lists them)")
    return load_config(_config_file(arg), overrides), None


def _configs(args) -> int:
    """``masrl configs``: the shipped configs by name, each with the first line of its header."""
    from masrl.families import shipped_configs

    for name, path in shipped_configs().items():
        lines = [x[1:].strip() for x in path.read_text().splitlines() if x.startswith("#")]
        print(f"{name:34} {lines[0] if lines else ''}")
    return 0


def _same_as_run(cfg, run, given: str) -> None:
    """``masrl train CONFIG --resume`` continues the run in ``cfg``'s folder only where CONFIG is the
    config that run was trained with; otherwise it says so, and what continues it as it was."""
    from masrl.driver.run.rundir import config_differences

    diff = config_differences(run.saved_config(), cfg)
    if diff:
        shown = "; ".join(f"{k}: {a!r} in the run, {b!r} here" for k, a, b in diff[:3])
        more = f" (and {len(diff) - 3} more)" if len(diff) > 3 else ""
        raise MasrlError(f"{run.path} was trained with another config than {given} ({shown}{more}); continue it as "
                         f"it was trained with {run.continue_command()} (add key=value to change a setting)")


def _train(args) -> int:
    from masrl.driver.run.rundir import RunDir

    cfg, run = _target(args.config, args.overrides)
    if run is not None and not args.resume:
        raise MasrlError(f"{args.config} is a run; continue it with {run.continue_command()}, or train a new run from "
                         f"its config: masrl train {run.config_file} output_dir=...")
    if run is None and args.resume and RunDir.find(cfg.run_dir()) is not None:
        _same_as_run(cfg, RunDir(cfg.run_dir()), args.config)
    return _run_training(cfg, resume=args.resume)


def _resume(args) -> int:
    from masrl.driver.run.rundir import RunDir

    run = RunDir.find(args.run)
    if run is None:
        raise MasrlError(f"{args.run}: not a run directory (no config.yaml there); give the folder `masrl train` "
                         f"wrote (runs/<name>, or its output_dir)")
    return _run_training(run.config(args.overrides), resume=True)


def _run_training(cfg, *, resume: bool) -> int:
    import signal

    from masrl.driver.run.loop import train

    handler = _interrupt_handler()
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)  # a scheduler's stop, `kill`: the run unwinds as on Ctrl-C
    try:
        results = train(cfg, resume=resume)
    except KeyboardInterrupt:
        print(f"\n[masrl] interrupted. {_where_it_stands(cfg.run_dir())}", file=sys.stderr)
        return 130
    if results.get("stopped"):  # the run ended early because it had stopped learning: say so, fail the command
        print(f"error: {results['stopped']}", file=sys.stderr)
        return 3
    return 0


def _where_it_stands(run_dir) -> str:
    """After an interrupt: whether a checkpoint exists, and the exact command that continues this run."""
    from masrl.driver.run.rundir import RunDir

    run = RunDir(run_dir)
    if not run.config_file.is_file():
        return f"Nothing of the run was kept ({run_dir} was not written); start it again with the same command."
    latest = run.latest()
    if latest is None:
        return (f"No checkpoint was written yet, so nothing trained is kept; {run.continue_command()} starts this run "
                f"again from step 0 with its config.")
    step = json.loads((latest / "state.json").read_text())["step"]
    return (f"The last checkpoint is step {step} ({latest}), intact; continue from it with: "
            f"{run.continue_command()}")


def _eval(args) -> int:
    from pathlib import Path

    from masrl.driver.run.loop import evaluate
    from masrl.driver.run.rundir import RunDir

    cfg, run = _target(args.config, args.overrides)
    if run is None:  # a config: its own weights, or --checkpoint's (which must fit it)
        if args.step is not None:
            raise MasrlError("--step picks a checkpoint of a run: masrl eval RUN --step N")
        owner = RunDir.find(args.checkpoint) if args.checkpoint else None
        out = Path(cfg.output_dir) / "eval.json" if cfg.output_dir else None
        if owner is not None and out is None:  # the figures go to the run whose weights they are
            from masrl.driver.run.rundir import resolve_checkpoint

            path = resolve_checkpoint(args.checkpoint)
            out = owner.path / "evals" / f"{path.name}-{Path(str(args.config)).stem}.json"
        evaluate(cfg, checkpoint=args.checkpoint, out=out,
                 note={"config": args.config, "checkpoint": args.checkpoint, "overrides": args.overrides})
        return 0
    if args.checkpoint is not None:
        raise MasrlError(f"{args.config} is a run: pick one of its checkpoints with --step N or --step best, not "
                         f"--checkpoint")
    given = Path(args.config)
    path = given if (given / "state.json").is_file() else run.checkpoint(args.step)
    name = path.name + (f"-{_digest(args.overrides)}" if args.overrides else "")
    evaluate(cfg, checkpoint=path, out=run.path / "evals" / f"{name}.json",
             fix=f"the run's own config takes them: masrl eval {run.path}",
             note={"checkpoint": str(path), "overrides": args.overrides})
    return 0


def _digest(overrides: list[str]) -> str:
    import hashlib

    return hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]


def _export(args) -> int:
    from masrl.driver.run.rundir import RunDir
    from masrl.worker.model.export import export_run

    run = RunDir.find(args.run)
    if run is None:
        raise MasrlError(f"{args.run}: not a run directory (no config.yaml there); give the folder `masrl train` wrote")
    path = run.checkpoint(args.step)
    written = export_run(run.saved_config(), path, args.to, merge=args.merge, log=print)
    print(f"[masrl] exported {path} to {args.to}: " + ", ".join(f"{k} ({v})" for k, v in written.items()))
    return 0


def _report(args) -> int:
    from masrl.cli.report import build_report

    path = build_report(args.run_dir, args.out, max_steps=args.max_steps, max_chars=args.max_chars)
    print(f"[masrl] wrote {path} (open it in a browser)")
    return 0


def _environment(args) -> int:
    from masrl.driver.serving.environment import serve_environment

    serve_environment(args.config, args.overrides, split=args.split, host=args.host, port=args.port,
                      max_sessions=args.max_sessions)
    return 0


def _serve(args) -> int:
    import signal
    from pathlib import Path

    from masrl.driver.serving.serve import serve
    from masrl.web.server import ServerLimits

    cfg, run = _target(args.config, args.overrides)
    if run is not None:
        if args.checkpoint is not None:
            raise MasrlError(f"{args.config} is a run: pick one of its checkpoints with --step N or --step best")
        given = Path(args.config)  # a checkpoint folder inside the run, or the run (its --step, else its latest)
        args.checkpoint = str(given if (given / "state.json").is_file() else run.checkpoint(args.step))
    elif args.step is not None:
        raise MasrlError("--step picks a checkpoint of a run: masrl serve RUN --step N")
    signal.signal(signal.SIGINT, _interrupt_handler(5.0))
    try:
        limits = ServerLimits(idle_timeout_s=args.read_timeout_s, body_timeout_s=args.read_timeout_s,
                              max_connections=args.max_connections, max_body_bytes=args.max_body_mb * 2**20)
        serve(cfg, checkpoint=args.checkpoint, host=args.host, port=args.port, api_key_env=args.api_key_env,
              limits=limits)
    except KeyboardInterrupt:
        print("\n[masrl] stopped", file=sys.stderr)
    return 0


def _compare(args) -> int:
    from masrl.cli.compare import build_compare

    path = build_compare(args.run_dirs, args.out, print_table=print, head_to_head_games=args.head_to_head,
                         overrides=args.set)
    print(f"[masrl] wrote {path} (open it in a browser: curves, every agent's figures)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from masrl.web.server import bounded

    p = argparse.ArgumentParser(prog="masrl", description="Train LLM multi-agent systems with RL.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a workflow's agents (eval before and after)")
    t.add_argument("config", help="a YAML run config, or a shipped one by name (math/solver; `masrl configs` lists them)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.steps=5")
    t.add_argument("--resume", action="store_true", help="continue the run this config writes (`masrl resume RUN` "
                                                         "continues a run by its folder, as it was trained)")
    t.set_defaults(fn=_train)
    u = sub.add_parser("resume", help="continue a run from its latest checkpoint, with the config it was trained with")
    u.add_argument("run", help="the run's folder (runs/<name>, or its output_dir)")
    u.add_argument("overrides", nargs="*", help="settings to change as it continues, e.g. train.steps=40")
    u.set_defaults(fn=_resume)
    e = sub.add_parser("eval", help="held-out figures of a run's weights (masrl eval RUN) or of a config's model")
    e.add_argument("config", help="a run's folder (its config and latest checkpoint; figures go to RUN/evals/), "
                                  "a YAML run config or a shipped one's name")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--step", help="with a run: the checkpoint of step N, or 'best' (default: the latest)")
    e.add_argument("--checkpoint", help="with a config: a step_NNNNNN checkpoint folder or a run directory whose "
                                        "weights fit the config")
    e.set_defaults(fn=_eval)
    x = sub.add_parser("export", help="a run's trained weights as Hugging Face folders (full models) and PEFT "
                                      "adapters (LoRA policies), one folder per policy")
    x.add_argument("run", help="the run's folder")
    x.add_argument("--step", help="the checkpoint of step N, or 'best' (default: the latest)")
    x.add_argument("--to", required=True, help="the folder to write (must not hold an export already)")
    x.add_argument("--merge", action="store_true", help="LoRA policies: write each adapter merged into its base as a "
                                                        "full model folder instead of a PEFT adapter")
    x.set_defaults(fn=_export)
    r = sub.add_parser("report", help="write RUN_DIR/report.html: curves and a trace browser, one static file")
    r.add_argument("run_dir")
    r.add_argument("--out", help="where to write it (default RUN_DIR/report.html)")
    r.add_argument("--max-steps", type=int, default=50, help="steps whose logged traces are kept (evenly spread)")
    r.add_argument("--max-chars", type=int, default=4000, help="texts are cut to this many characters")
    r.set_defaults(fn=_report)
    s = sub.add_parser("serve", help="serve a config's agents (a checkpoint's weights) behind an OpenAI-compatible "
                                     "API: model = agent name")
    s.add_argument("config", help="a run's folder (its config and latest checkpoint), a YAML run config or a shipped "
                                  "one's name")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--step", help="with a run: the checkpoint of step N, or 'best' (default: the latest)")
    s.add_argument("--checkpoint", help="with a config: a step_NNNNNN checkpoint folder or a run directory")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key-env", help="name of an environment variable holding the key requests must send")
    s.add_argument("--read-timeout-s", type=bounded(float, 0.01, 3600), default=30.0,
                   help="a connection's request line and headers, and then its body, must arrive within this")
    s.add_argument("--max-connections", type=bounded(int, 1, 100_000), default=1024,
                   help="open connections; past it a new one gets a 503 (1-100000)")
    s.add_argument("--max-body-mb", type=bounded(int, 1, 4096), default=16,
                   help="largest request body in MB; a larger one gets a 413 (1-4096)")
    s.set_defaults(fn=_serve)
    v = sub.add_parser("environment", help="serve a config's workflow on its tasks as an OpenEnv environment (the "
                                           "client writes every model reply; the reward is the family's score)")
    v.add_argument("config", help="a YAML run config or a shipped one's name (math/solver, reasoning_gym/solver, ...)")
    v.add_argument("overrides", nargs="*")
    v.add_argument("--split", choices=("eval", "train"), default="eval", help="whose tasks reset(seed) draws")
    v.add_argument("--host", default="127.0.0.1")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--max-sessions", type=bounded(int, 1, 4096), default=64, help="episodes at once (1-4096)")
    v.set_defaults(fn=_environment)
    c = sub.add_parser("compare", help="one HTML page: runs grouped by config name (seeds), held-out accuracy "
                                       "against training calls, tokens and seconds, with the spread over seeds")
    c.add_argument("run_dirs", nargs="+")
    c.add_argument("--out", default="compare.html")
    c.add_argument("--head-to-head", type=int, default=0, metavar="GAMES",
                   help="game runs: their latest checkpoints and the untrained model play each other GAMES held-out "
                        "games a pair, both seats, and an Elo rating is fitted to the table")
    c.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides for the head-to-head evaluations (e.g. device=cuda)")
    c.set_defaults(fn=_compare)
    k = sub.add_parser("configs", help="list the shipped configs (family/name), each with its header's first line")
    k.set_defaults(fn=_configs)
    from masrl.cli import tools as cli_tools

    cli_tools.add_commands(sub)
    return p


def _quiet_libraries() -> None:
    """Library warnings and progress bars that are not the user's business stay off the console
    (masrl's own warnings and its one progress display stay)."""
    import os
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("WANDB_SILENT", "true")
    for lib in ("transformers", "peft", "torch", "accelerate", "huggingface_hub", "bm25s", "wandb"):
        for cat in (FutureWarning, DeprecationWarning, UserWarning):
            warnings.filterwarnings("ignore", category=cat, module=lib)


def main(argv: list[str] | None = None) -> int:
    _quiet_libraries()
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may also come after --options (e.g. eval CONFIG --checkpoint RUN key=value)
    if extra and hasattr(args, "overrides") and all("=" in x and not x.startswith("-") for x in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.fn(args)
    except MasrlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

