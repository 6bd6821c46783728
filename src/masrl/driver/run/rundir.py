"""A run directory as one object: its ``config.yaml`` is the truth for everything done to it later.

``masrl eval RUN``, ``masrl resume RUN``, ``masrl serve RUN``, ``masrl export RUN`` and ``masrl report
RUN`` read the run's own resolved config (plus any ``key=value`` on top), never a config by name,
so a run trained with overrides is evaluated, resumed and served as it was trained. What may change
on top is checked against the checkpoint before any weight loads (``checkpoints.check_fits``), and a
run's place is its folder (``name`` and ``output_dir`` cannot be overridden).

The files a run appends to (``metrics.jsonl``, ``traces.jsonl``, ``eval_traces.jsonl``) are read
line by line on ``\\n`` alone (JSON's own rule), and a line that does not parse (the torn last line a
kill -9 or a full disk leaves) is skipped, so a run never fails on its own files; ``forget_after``
rewrites them atomically when a resume redoes the steps past its checkpoint.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from masrl.config import RunConfig, load_config
from masrl.driver.run import checkpoints as ckpt
from masrl.errors import ConfigError, MasrlError

CONFIG = "config.yaml"
APPENDED = ("metrics.jsonl", "traces.jsonl", "eval_traces.jsonl")
PLACE_KEYS = ("name", "output_dir")  # where a run lives: fixed once it exists


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file a run appends to (none when it is missing). Lines split on
    ``\\n`` only; a line that is not one JSON object (torn by a kill or a full disk) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_bytes().decode("utf-8", errors="replace").split("\n"):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def write_atomically(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file and a rename: a kill leaves the old or the new."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RunDir:
    """The folder of one run: ``config.yaml``, ``checkpoints/``, the JSONL logs, the evaluations."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @staticmethod
    def find(arg: str | Path) -> "RunDir | None":
        """The run ``arg`` names: a folder holding ``config.yaml``, or a checkpoint inside one
        (``RUN/checkpoints/step_NNNNNN``, ``RUN/checkpoints/best``); None when it is neither."""
        p = Path(arg)
        if (p / CONFIG).is_file():
            return RunDir(p)
        if p.parent.name == "checkpoints" and (p.parent.parent / CONFIG).is_file():
            return RunDir(p.parent.parent)
        return None

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def config(self, overrides: list[str] | None = None) -> RunConfig:
        """The run's resolved config with ``overrides`` on top; its place stays this folder."""
        for text in overrides or []:
            key = text.split("=", 1)[0]
            if key in PLACE_KEYS:
                raise ConfigError(f"override {text}: a run's place is its folder ({self.path}); to start another run "
                                  f"from its config, use masrl train {shlex.quote(str(self.config_file))} {text}")
        cfg = load_config(self.config_file, overrides)
        return cfg.model_copy(update={"output_dir": str(self.path)})

    def saved_config(self) -> RunConfig:
        """The config as the run wrote it (its weights' record), without overrides."""
        return load_config(self.config_file)

    def latest(self) -> Path | None:
        return ckpt.latest_checkpoint(self.checkpoints)

    def checkpoint(self, step: str | int | None = None) -> Path:
        """A checkpoint of this run: the latest (``None``), ``best`` (``train.keep_best``), or step ``N``."""
        if step is None:
            found = self.latest()
            if found is None:
                raise MasrlError(f"{self.path}: the run has no checkpoint yet (none in {self.checkpoints}); train it "
                                 f"first, or resume it: masrl resume {shlex.quote(str(self.path))}")
            return found
        if str(step) == "best":
            found = self.checkpoints / "best"
            if not (found / "state.json").is_file():
                raise MasrlError(f"{self.path}: no best checkpoint ({found}); it is kept only with train.keep_best")
            return found
        try:
            n = int(step)
        except ValueError:
            raise MasrlError(f"--step {step}: give a step number or 'best'") from None
        found = ckpt.step_dir(self.checkpoints, n)
        if not (found / "state.json").is_file():
            have = ", ".join(str(s) for s in self.steps()) or "none"
            raise MasrlError(f"{self.path}: no checkpoint of step {n} (steps kept: {have}; train.keep_last sets how "
                             f"many are kept)")
        return found

    def steps(self) -> list[int]:
        """The steps whose checkpoints are kept, oldest first."""
        if not self.checkpoints.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.checkpoints.iterdir()
                      if (m := ckpt.STEP_DIR.match(p.name)) and (p / "state.json").is_file())

    def read(self, name: str) -> list[dict]:
        return read_jsonl(self.path / name)

    def forget_after(self, step: int) -> None:
        """Drop the logged lines of steps after ``step`` (they ran past the checkpoint and are redone),
        and any line a kill tore; each file is replaced atomically."""
        for name in APPENDED:
            path = self.path / name
            if path.is_file():
                keep = [r for r in read_jsonl(path) if _step_of(r) <= step]
                write_atomically(path, "".join(json.dumps(r, default=str) + "\n" for r in keep))

    def continue_command(self) -> str:
        return f"masrl resume {shlex.quote(str(self.path))}"


def _step_of(record: dict) -> int:
    try:
        return int(record.get("step", 0))
    except (TypeError, ValueError):
        return 0


def config_differences(a: RunConfig, b: RunConfig) -> list[tuple[str, object, object]]:
    """``(dotted key, value in a, value in b)`` for every setting the two configs disagree on."""
    out: list[tuple[str, object, object]] = []

    def walk(x, y, key: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in list(x) + [k for k in y if k not in x]:
                walk(x.get(k), y.get(k), f"{key}.{k}" if key else str(k))
        elif x != y:
            out.append((key, x, y))

    walk(a.model_dump(mode="json"), b.model_dump(mode="json"), "")
    return out
