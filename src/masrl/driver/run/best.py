"""``train.keep_best``: the weights that score best on a validation split, kept as ``checkpoints/best``.

The validation split is drawn from the training tasks (the training distribution) and held back
from training; the held-out set never chooses a checkpoint. Every ``every`` steps, and after the
last, the run is scored on it greedily (as an evaluation is); a strictly better score replaces
``checkpoints/best`` atomically (its ``state.json`` holds the step and the score), so a resumed run
knows its best so far. After training the held-out set is scored at the best weights too, beside
the last step's (label ``best`` in metrics.jsonl, ``eval_best.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from masrl.config import KeepBestConfig
from masrl.driver.observe.metrics import eval_line
from masrl.driver.run import rundir as ckpt

BEST = "best"


class KeepBest:
    def __init__(self, settings: KeepBestConfig, ckpt_root: Path):
        self.settings = settings
        self.path = Path(ckpt_root) / BEST
        self.step: int | None = None
        self.score: float | None = None
        state = self.path / "state.json"
        if state.is_file():  # a resumed run continues from its best so far
            got = json.loads(state.read_text())
            self.step, self.score = int(got["step"]), float(got["validation"])

    def due(self, step: int, last: int) -> bool:
        return step > 0 and (step % self.settings.every == 0 or step == last)

    def consider(self, step: int, score: float, fill: Callable[[Path], None]) -> bool:
        """Keep the weights of ``step`` when ``score`` beats the best so far (``fill`` writes them
        into a folder); True when they were kept."""
        if self.score is not None and score <= self.score:
            return False

        def write(tmp: Path) -> None:
            fill(tmp)
            (tmp / "state.json").write_text(json.dumps({**json.loads((tmp / "state.json").read_text()),
                                                        "validation": score}))

        ckpt.write_atomically(self.path, write)
        self.step, self.score = step, score
        return True

    async def validate(self, trainer, loggers) -> None:
        """Score ``trainer``'s validation split now; its weights are kept when they beat the best."""
        summary = await trainer.evaluate(f"validation at step {trainer.step}", trainer.validation_tasks)
        # evaluated, never resumed from: no optimizer state (most of a checkpoint's bytes with AdamW)
        kept = self.consider(trainer.step, summary.get("outcome", 0.0),
                             lambda tmp: trainer._fill_checkpoint(tmp, weights_only=True))
        loggers.log_eval(trainer.step, "validation", {**summary, "kept": kept})
        trainer.log(f"[masrl] validation at step {trainer.step}: {summary.get('outcome', 0.0):.3f}"
                    + (" (best so far: kept as checkpoints/best)" if kept else
                       f" (best: {self.score:.3f} at step {self.step})"))

    async def eval_best(self, trainer, loggers, after: dict) -> dict:
        """The held-out figures at the best-by-validation weights (the last step's when they are the best),
        once the run is over."""
        if self.step == trainer.step:
            summary = dict(after)
        else:
            last = trainer.step
            trainer.load_checkpoint(self.path, with_optimizer=False)  # the run is over: its state is saved
            trainer.step = self.step
            summary = await trainer.evaluate(f"eval at the best checkpoint (step {self.step})")
            trainer.step = last  # the run trained `last` steps: what it reports after this says so
        summary.update(best_step=self.step, validation=self.score)
        trainer.write_eval_traces(trainer.run_dir / "eval_traces.jsonl", self.step, "best")
        loggers.log_eval(self.step, "best", summary)
        trainer._write_json("eval_best.json", summary)
        trainer.log(f"[masrl] held-out at the best-by-validation checkpoint (step {self.step}, validation "
                    f"{self.score:.3f}): {eval_line(summary)}")
        return summary
