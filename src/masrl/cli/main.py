"""``masrl`` command line. Heavy imports happen inside the commands."""

from __future__ import annotations

import argparse
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


def _configs(args) -> int:
    """``masrl configs``: the shipped configs by name, each with the first line of its header."""
    from masrl.families import shipped_configs

    for name, path in shipped_configs().items():
        lines = [x[1:].strip() for x in path.read_text().splitlines() if x.startswith("#")]
        print(f"{name:34} {lines[0] if lines else ''}")
    return 0


def _train(args) -> int:
    import signal

    from masrl.config import load_config
    from masrl.driver.run.loop import train

    cfg = load_config(_config_file(args.config), args.overrides)
    signal.signal(signal.SIGINT, _interrupt_handler())
    try:
        results = train(cfg, resume=args.resume)
    except KeyboardInterrupt:
        print(f"\n[masrl] interrupted. Checkpoints in {cfg.run_dir() / 'checkpoints'} are intact; "
              f"continue with: masrl train {args.config} --resume", file=sys.stderr)
        return 130
    if results.get("stopped"):  # the run ended early because it had stopped learning: say so, fail the command
        print(f"error: {results['stopped']}", file=sys.stderr)
        return 3
    return 0


def _eval(args) -> int:
    from masrl.config import load_config
    from masrl.driver.run.loop import evaluate

    cfg = load_config(_config_file(args.config), args.overrides)
    evaluate(cfg, checkpoint=args.checkpoint)
    return 0


def _report(args) -> int:
    from masrl.cli.report import build_report

    path = build_report(args.run_dir, args.out, max_steps=args.max_steps, max_chars=args.max_chars)
    print(f"[masrl] wrote {path} (open it in a browser)")
    return 0


def _serve(args) -> int:
    import signal

    from masrl.config import load_config
    from masrl.driver.serving.serve import serve
    from masrl.tools.web import ServerLimits

    cfg = load_config(_config_file(args.config), args.overrides)
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

    path = build_compare(args.run_dirs, args.out)
    print(f"[masrl] wrote {path} (open it in a browser)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="masrl", description="Train LLM multi-agent systems with RL.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a workflow's agents (eval before and after)")
    t.add_argument("config", help="a YAML run config, or a shipped one by name (math/solver; `masrl configs` lists them)")
    t.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.steps=5")
    t.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    t.set_defaults(fn=_train)
    e = sub.add_parser("eval", help="evaluate on the held-out set")
    e.add_argument("config", help="a YAML run config or a shipped one's name")
    e.add_argument("overrides", nargs="*")
    e.add_argument("--checkpoint", help="a step_NNNNNN checkpoint folder or a run directory")
    e.set_defaults(fn=_eval)
    r = sub.add_parser("report", help="write RUN_DIR/report.html: curves and a trace browser, one static file")
    r.add_argument("run_dir")
    r.add_argument("--out", help="where to write it (default RUN_DIR/report.html)")
    r.add_argument("--max-steps", type=int, default=50, help="steps whose logged traces are kept (evenly spread)")
    r.add_argument("--max-chars", type=int, default=4000, help="texts are cut to this many characters")
    r.set_defaults(fn=_report)
    s = sub.add_parser("serve", help="serve a config's agents (a checkpoint's weights) behind an OpenAI-compatible "
                                     "API: model = agent name")
    s.add_argument("config", help="a YAML run config or a shipped one's name")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--checkpoint", help="a step_NNNNNN checkpoint folder or a run directory")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key-env", help="name of an environment variable holding the key requests must send")
    s.add_argument("--read-timeout-s", type=float, default=30.0,
                   help="a connection's request line and headers, and then its body, must arrive within this")
    s.add_argument("--max-connections", type=int, default=1024, help="open connections; past it a new one gets a 503")
    s.add_argument("--max-body-mb", type=int, default=16, help="largest request body; a larger one gets a 413")
    s.set_defaults(fn=_serve)
    c = sub.add_parser("compare", help="one HTML page: runs grouped by config name (seeds), held-out accuracy "
                                       "against training calls, tokens and seconds, with the spread over seeds")
    c.add_argument("run_dirs", nargs="+")
    c.add_argument("--out", default="compare.html")
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

