"""A run directory as one object: its ``config.yaml`` is the truth for everything done to it later.

``masrl eval RUN``, ``masrl resume RUN``, ``masrl serve RUN``, ``masrl export RUN`` and ``masrl report
RUN`` read the run's own resolved config (plus any ``key=value`` on top), never a config by name,
so a run trained with overrides is evaluated, resumed and served as it was trained. What may change
on top is checked against the checkpoint before any weight loads (``check_fits``), and a
run's place is its folder (``name`` and ``output_dir`` cannot be overridden).

The files a run appends to (``metrics.jsonl``, ``traces.jsonl``, ``eval_traces.jsonl``) are read
line by line on ``\\n`` alone (JSON's own rule), and a line that does not parse (the torn last line a
kill -9 or a full disk leaves) is skipped, so a run never fails on its own files; ``forget_after``
rewrites them atomically when a resume redoes the steps past its checkpoint.

Checkpoints: the ``step_NNNNNN`` folders of a run, written atomically, found, pruned.

Layout of one checkpoint directory (written to a temp name and renamed, so an interrupted
save never leaves a half-written checkpoint behind):

  step_000005/
    state.json                 step, policies, config name, and each policy's layout (its model; an
                               adapter's rank and modules: ``weights_layout``)
    <policy>/...               each host's policies (``worker.state``: weights or adapter,
                               value head, optimizer state)
    critics/<name>.pt, worker_<policies>.json
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
from pathlib import Path

from masrl.config import RunConfig, load_config
from masrl.errors import ConfigError, MasrlError

STEP_DIR = re.compile(r"^step_(\d{6})$")
_LEFTOVER = re.compile(r"^step_(\d{6})\.old$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def latest_checkpoint(root: Path) -> Path | None:
    root = Path(root)
    if not root.is_dir():
        return None
    found = sorted((int(m.group(1)), p.name.endswith(".old"), p) for p in root.iterdir()
                   if (m := STEP_DIR.match(p.name) or _LEFTOVER.match(p.name)) and (p / "state.json").is_file())
    # a step_N.old is complete: it was moved aside just before a crash; step_N wins when both exist
    best: dict[int, Path] = {}
    for step, is_old, p in found:
        if step not in best or not is_old:
            best[step] = p
    return best[max(best)] if best else None


def resolve_checkpoint(given: str | Path) -> Path:
    """The checkpoint folder ``given`` names: a ``step_NNNNNN`` folder, or a run directory (its
    latest checkpoint). Checked before any model loads; the error says what was expected."""
    path = Path(given)
    if (path / "state.json").is_file():
        return path
    if not path.exists():
        raise MasrlError(f"--checkpoint {given}: no checkpoint there (no such file or directory)")
    latest = latest_checkpoint(path / "checkpoints") or latest_checkpoint(path)
    if latest is None:
        raise MasrlError(f"--checkpoint {given}: no checkpoint there (expected a step_NNNNNN folder with state.json, "
                         f"or a run directory holding checkpoints/)")
    return latest


def write_atomically(target: Path, fill) -> Path:
    """Call ``fill(tmp_dir)``, then put ``tmp_dir`` in ``target``'s place.

    A checkpoint that already sits at ``target`` is moved aside (``.old``) and deleted only once
    the new one is in place; if the process dies between the two renames, ``latest_checkpoint``
    finds the ``.old`` one, so there is always a complete checkpoint.
    """
    tmp = target.with_name(target.name + ".tmp")
    old = target.with_name(target.name + ".old")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
    except Exception as e:
        if not _disk_full(e, tmp):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise MasrlError(_disk_full_message(target)) from e
    if target.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(tmp, target)
    if old.exists():
        shutil.rmtree(old)
    return target


LOW_SPACE = 256 * 2**20  # bytes free below which a failed save is put down to the disk


def _disk_full(e: BaseException | None, folder: Path) -> bool:
    """ENOSPC, also where a writer wraps it in its own error (safetensors: "No space left on device"
    in its message; torch.save: "basic_ios::clear: iostream error", no cause at all, hence the
    free-space check)."""
    while e is not None:
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    try:
        return shutil.disk_usage(folder).free < LOW_SPACE
    except OSError:
        return False


def _size_gib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30


def _disk_full_message(target: Path) -> str:
    root = target.parent
    free = shutil.disk_usage(root).free / 2**30
    others = sorted(p for p in root.iterdir() if p.is_dir() and (p / "state.json").is_file()) if root.is_dir() else []
    held = (f"; the {len(others)} checkpoint(s) already in {root} take {sum(_size_gib(p) for p in others):.2f} GiB "
            f"({', '.join(p.name for p in others)})") if others else ""
    return (f"checkpoint {target}: the disk is full ({free:.2f} GiB free{held}). The half-written checkpoint was "
            f"removed and the run stopped; the last complete checkpoint is intact, so it resumes from there. Free "
            f"space (finished runs' checkpoints), keep fewer (train.keep_last=1), save less often "
            f"(train.save_every), or write the run elsewhere (output_dir=...)")


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints (and leftovers of interrupted saves)."""
    root = Path(root)
    if keep <= 0 or not root.is_dir():
        return []
    done = sorted((int(m.group(1)), p) for p in root.iterdir()
                  if (m := STEP_DIR.match(p.name)) and (p / "state.json").is_file())
    removed = [p for _, p in done[:-keep]]
    newest = done[-1][0] if done else None
    for p in root.iterdir():
        m = _LEFTOVER.match(p.name)
        if m and newest is not None and int(m.group(1)) <= newest and not p.name.endswith(".tmp"):
            removed.append(p)
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


# -- which weights a checkpoint holds ----------------------------------------------------------------

def weights_layout(cfg) -> dict[str, dict]:
    """What each policy's saved weights are: the model they belong to and, for an adapter, its shape.
    Written into every checkpoint's ``state.json``; a config whose layout differs cannot load them."""
    out = {}
    for name, p in cfg.policies.items():
        lora = None if p.lora is None else {"r": p.lora.r, "target_modules": sorted(p.lora.target_modules)}
        out[name] = {"model": cfg.policy_model(name), "lora": lora}
    return out


def _describe(entry: dict) -> str:
    lora = entry.get("lora")
    kind = f"LoRA r={lora['r']} on" if lora else "full weights of"
    return f"{kind} {entry.get('model')}"


def _same_model(a, b) -> bool:
    if a == b:
        return True
    try:
        return a is not None and b is not None and Path(a).resolve() == Path(b).resolve() and Path(a).exists()
    except OSError:
        return False


def saved_layout(path: Path) -> dict[str, dict] | None:
    """The layout a checkpoint was saved with: its ``state.json``'s, or for a checkpoint written before
    layouts were recorded, its run's ``config.yaml``'s (None when neither says)."""
    state = json.loads((Path(path) / "state.json").read_text())
    if isinstance(state.get("layout"), dict):
        return state["layout"]
    run_config = Path(path).parent.parent / "config.yaml"
    if Path(path).parent.name == "checkpoints" and run_config.is_file():
        try:
            return weights_layout(load_config(run_config))
        except MasrlError:
            return None
    return None


def check_fits(path: Path, cfg, *, fix: str) -> None:
    """Refuse, in one line naming both, a config whose policies would not take the weights of the
    checkpoint ``path`` (another model, full weights against an adapter, another adapter shape, a
    trainable policy the checkpoint has no weights for); ``fix`` ends the message. Before any weight loads."""
    path = Path(path)
    saved = saved_layout(path)
    held = {p.name for p in path.iterdir() if p.is_dir() and p.name not in ("critics",)}
    want = weights_layout(cfg)
    for name, entry in want.items():
        trainable = not cfg.policies[name].frozen
        if name not in held:
            if trainable:
                raise MasrlError(f"checkpoint {path} holds no weights for policy '{name}' (it holds "
                                 f"{', '.join(sorted(held)) or 'none'}); {fix}")
            continue
        got = (saved or {}).get(name)
        if got is None:
            continue
        if not _same_model(got.get("model"), entry["model"]) or (got.get("lora") or None) != (entry["lora"] or None):
            hint = (f" (or give this config the checkpoint's model: policies.{name}.model={got.get('model')})"
                    if not _same_model(got.get("model"), entry["model"]) else "")
            raise MasrlError(f"checkpoint {path} holds policies.{name} as {_describe(got)}, but this config has "
                             f"{_describe(entry)}; {fix}{hint}")


# -- the run's folder ------------------------------------------------------------------------------

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


def make_run_dir(path: Path) -> None:
    """Create a run's folder; a path that cannot be one (a file, a folder under a file, no permission) is a
    one-line ``ConfigError`` naming ``output_dir``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"output_dir {path}: that is a file, not a folder; give a folder for the run")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".masrl-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"output_dir {path}: cannot write the run there ({exc.strerror or exc}); give a folder "
                          f"you can write to") from None


def replace_file(path: Path, text: str) -> None:
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
        return latest_checkpoint(self.checkpoints)

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
        found = step_dir(self.checkpoints, n)
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
                      if (m := STEP_DIR.match(p.name)) and (p / "state.json").is_file())

    def read(self, name: str) -> list[dict]:
        return read_jsonl(self.path / name)

    def forget_after(self, step: int) -> None:
        """Drop the logged lines of steps after ``step`` (they ran past the checkpoint and are redone),
        and any line a kill tore; each file is replaced atomically."""
        for name in APPENDED:
            path = self.path / name
            if path.is_file():
                keep = [r for r in read_jsonl(path) if _step_of(r) <= step]
                replace_file(path, "".join(json.dumps(r, default=str) + "\n" for r in keep))

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
