"""Where metrics go: one ``Logger`` interface, chosen in config (``train.loggers``).

``jsonl`` (always on: ``metrics.jsonl``, ``traces.jsonl``, the files the report reads),
``tensorboard`` (event files under ``RUN_DIR/tensorboard``; needs ``pip install tensorboard``),
``wandb`` (Weights & Biases, ``train.wandb_mode: offline`` by default, files under ``RUN_DIR/wandb``;
needs ``pip install wandb``), or ``module:factory`` (called with the run directory and the config).
Nested records are flattened to ``section/sub/key`` scalars for the last two.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Protocol

from masrl.errors import ConfigError
from masrl.trace import Trace


class Logger(Protocol):
    def log_step(self, step: int, record: dict) -> None: ...

    def log_eval(self, step: int, label: str, summary: dict) -> None: ...

    def log_traces(self, step: int, traces: list[Trace]) -> None: ...

    def close(self) -> None: ...


def flatten(record: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in record.items():
        key = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        elif isinstance(v, numbers.Number) and not isinstance(v, bool):
            out[key] = float(v)
    return out


class JSONLLogger:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.traces_path = Path(run_dir) / "traces.jsonl"

    def _append(self, path: Path, line: dict) -> None:
        with path.open("a") as f:
            f.write(json.dumps(line, default=str) + "\n")

    def log_step(self, step: int, record: dict) -> None:
        self._append(self.path, record)

    def log_eval(self, step: int, label: str, summary: dict) -> None:
        self._append(self.path, {"step": step, "eval": label, **{k: v for k, v in summary.items() if k != "step"}})

    def log_traces(self, step: int, traces: list[Trace]) -> None:
        for t in traces:
            self._append(self.traces_path, {**t.to_dict(), "step": step})

    def close(self) -> None:
        pass


class TensorBoardLogger:
    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("train.loggers: tensorboard needs the tensorboard package: pip install tensorboard") from None
        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log_step(self, step: int, record: dict) -> None:
        for k, v in flatten({k: v for k, v in record.items() if k != "step"}).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_eval(self, step: int, label: str, summary: dict) -> None:
        for k, v in flatten(summary).items():
            self.writer.add_scalar(f"eval/{k}", v, step)
        self.writer.flush()

    def log_traces(self, step: int, traces: list[Trace]) -> None:
        pass

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, run_dir: Path, cfg):
        try:
            import wandb
        except ImportError:
            raise ConfigError("train.loggers: wandb needs the wandb package: pip install wandb") from None
        self.wandb = wandb
        self.run = wandb.init(project=cfg.train.wandb_project, name=cfg.name, dir=str(run_dir),
                              mode=cfg.train.wandb_mode, config=cfg.model_dump(mode="json"), reinit="finish_previous")

    def log_step(self, step: int, record: dict) -> None:
        self.run.log(flatten({k: v for k, v in record.items() if k != "step"}), step=step)

    def log_eval(self, step: int, label: str, summary: dict) -> None:
        self.run.log({f"eval/{k}": v for k, v in flatten(summary).items()}, step=step)

    def log_traces(self, step: int, traces: list[Trace]) -> None:
        pass

    def close(self) -> None:
        self.run.finish()


class Loggers:
    """All configured loggers as one."""

    def __init__(self, loggers: list):
        self.loggers = loggers

    def log_step(self, step: int, record: dict) -> None:
        for lg in self.loggers:
            lg.log_step(step, record)

    def log_eval(self, step: int, label: str, summary: dict) -> None:
        for lg in self.loggers:
            lg.log_eval(step, label, summary)

    def log_traces(self, step: int, traces: list[Trace]) -> None:
        for lg in self.loggers:
            lg.log_traces(step, traces)

    def close(self) -> None:
        for lg in self.loggers:
            lg.close()


def build_loggers(cfg, run_dir: Path) -> Loggers:
    out: list = [JSONLLogger(run_dir)]
    for i, name in enumerate(cfg.train.loggers):
        if name == "jsonl":
            continue
        if name == "tensorboard":
            out.append(TensorBoardLogger(run_dir))
        elif name == "wandb":
            out.append(WandbLogger(run_dir, cfg))
        else:
            from masrl.config.loading import build_object, load_object

            factory = load_object(name, f"train.loggers.{i}")
            logger = build_object(factory, f"train.loggers.{i} ('{name}')", run_dir, cfg)
            missing = [m for m in ("log_step", "log_eval", "log_traces", "close") if not hasattr(logger, m)]
            if missing:
                raise ConfigError(f"train.loggers.{i}: '{name}' made a logger without {', '.join(missing)}")
            out.append(logger)
    return Loggers(out)
