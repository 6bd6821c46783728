"""The training loop, top to bottom: eval, then per step rollout -> rewards -> update -> log -> save."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

from rich.console import Console

from masrl.config import RunConfig, dump_config
from masrl.data.mix import data_report, mix
from masrl.data.sources import split_validation
from masrl.data.tasks import Task
from masrl.driver import faults
from masrl.driver.builder import Runtime, build_runtime
from masrl.driver.checks import check_run
from masrl.driver.observe.alarms import StuckWatch, collapse_alarms
from masrl.driver.observe.loggers import build_loggers
from masrl.driver.observe.metrics import (
    agent_result,
    check_failures,
    comparison_rich,
    eval_line,
    held_out_summary,
    memory_summary,
    sample_metrics,
    step_line,
    summaries_by,
)
from masrl.driver.observe.progress import progress
from masrl.driver.rollout import pools
from masrl.driver.run import rundir as ckpt
from masrl.driver.run.async_loop import AsyncRollouts
from masrl.driver.run.best import KeepBest
from masrl.driver.run.budget import TimeBudget
from masrl.driver.run.rundir import RunDir, make_run_dir, replace_file
from masrl.driver.run.stream import TaskStream
from masrl.driver.run.sync_step import SyncStep
from masrl.errors import MasrlError
from masrl.families import build_tasks, more_tasks_hint
from masrl.seeding import stable_seed


class Trainer:
    def __init__(self, cfg: RunConfig, *, console: Console | None = None, run_dir: Path | None = None):
        self.cfg = cfg
        self.console = console or Console(highlight=False)
        self.run_dir = Path(run_dir or cfg.run_dir())
        self.ckpt_root = self.run_dir / "checkpoints"
        self.plan = check_run(cfg)  # the whole config, before tasks are drawn or any model loads
        self.train_tasks, self.eval_tasks = build_tasks(cfg)
        kb = cfg.train.keep_best
        self.validation_tasks: list[Task] = []
        if kb is not None:  # held back from training, from the training distribution
            self.train_tasks, self.validation_tasks = split_validation(self.train_tasks, kb.n, cfg.seed)
        self.best = KeepBest(kb, self.ckpt_root) if kb is not None else None
        self.rt: Runtime | None = None
        self.step = 0
        self.stopped: str | None = None  # why the run ended early (train.stop_when_stuck)
        self.time_limited: str | None = None  # train.time_limit_s ended the steps early (a finished run)
        self._stuck_watch = StuckWatch(cfg.train.stop_when_stuck)
        self.last_traces: list = []  # the traces of the last step (the loop logs a few of them)
        self.last_eval_traces: list = []  # the last evaluation's (eval.log_traces of them go to eval_traces.jsonl)

    def log(self, msg: str) -> None:
        self.console.print(msg, markup=False, soft_wrap=True)

    # -- set-up ----------------------------------------------------------------------------------
    def prepare(self, *, resume: bool) -> None:
        run = RunDir(self.run_dir)
        existing = run.latest()
        self._check_place(run, existing, resume)
        self.log(f"[masrl] run '{self.cfg.name}' with seed {self.cfg.seed} -> {self.run_dir}")
        d = self.cfg.data
        report = data_report(train=self.train_tasks, held_out=self.eval_tasks, validation=self.validation_tasks,
                             train_n=d.train.n, eval_n=d.eval.n, hint=more_tasks_hint(d.train),
                             draws=self.cfg.train.steps * self.cfg.rollout.tasks_per_step)
        for line in report:
            self.log(f"[masrl] {line}")
        created = not self.run_dir.exists()
        make_run_dir(self.run_dir)
        try:
            if not run.config_file.is_file():  # a new run's record; a resumed run's is rewritten only
                replace_file(run.config_file, dump_config(self.cfg))  # once it really continues (below)
            self.rt = build_runtime(self.cfg, log=self.log, plan=self.plan)
        except BaseException:
            if created:  # a run that never started leaves nothing behind
                import shutil

                shutil.rmtree(self.run_dir, ignore_errors=True)
            raise
        if resume and existing is not None:
            self.load_checkpoint(existing)
            run.forget_after(self.step)
            self.log(f"[masrl] resumed from {existing} at step {self.step}")
        elif resume:
            run.forget_after(-1)  # what an earlier attempt logged before its first checkpoint is redone
            self.log(f"[masrl] no checkpoint in {self.ckpt_root} yet; starting at step 0")
        replace_file(run.config_file, dump_config(self.cfg))
        replace_file(self.run_dir / "data.json", json.dumps({  # what the splits held, for whoever reads the run
            "train_tasks": len(self.train_tasks), "validation_tasks": len(self.validation_tasks),
            "held_out_tasks": len(self.eval_tasks), "train_mix": mix(self.train_tasks),
            "held_out_mix": mix(self.eval_tasks), "report": report}, indent=1))
        if self.step == 0:  # init_from first; then an opponent pool starts as copies of the policy it trails
            for name in pools.load_initial(self.cfg, self.rt.workers):
                self.log(f"[masrl] {name} starts from {self.cfg.policies[name].init_from}")
            pools.start(self.cfg, self.rt.workers, self.run_dir)

    def _check_place(self, run: RunDir, existing: Path | None, resume: bool) -> None:
        """A new run starts in an empty place; a resumed one's checkpoint fits its policies (before any model loads)."""
        if existing is not None and not resume:
            raise MasrlError(f"{self.run_dir} already holds checkpoints (latest {existing.name}); continue it with "
                             f"{run.continue_command()}, or choose another run: output_dir=... or name=...")
        logged = self.run_dir / "metrics.jsonl"
        if existing is None and not resume and logged.is_file() and logged.stat().st_size > 0:
            raise MasrlError(f"{self.run_dir} already holds an earlier run's {logged.name} (and no checkpoint); a new run "
                             f"would append to it. Start it again from step 0 with {run.continue_command()} (its lines "
                             f"are dropped), or choose another run: output_dir=... or name=...")
        if resume and existing is not None:
            ckpt.check_fits(existing, self.cfg, fix=f"a run keeps the models and adapters it was trained with; "
                                                    f"continue it as it was: {run.continue_command()}")

    def load_checkpoint(self, path: Path, *, with_optimizer: bool = True) -> None:
        assert self.rt is not None
        state = json.loads((path / "state.json").read_text())
        for w in self.rt.workers:
            w.load(str(path), with_optimizer=with_optimizer)
        self.step = int(state["step"])

    def _fill_checkpoint(self, tmp: Path, weights_only: bool = False) -> None:
        assert self.rt is not None
        for w in self.rt.workers:
            w.save(str(tmp), weights_only=weights_only)
            faults.point(f"checkpoint:{self.step}")  # half-written
        (tmp / "state.json").write_text(json.dumps({"step": self.step, "name": self.cfg.name,
                                                    "policies": list(self.cfg.policies),
                                                    "layout": ckpt.weights_layout(self.cfg)}))

    def save_checkpoint(self) -> Path:
        path = ckpt.write_atomically(ckpt.step_dir(self.ckpt_root, self.step), self._fill_checkpoint)
        ckpt.prune(self.ckpt_root, self.cfg.train.keep_last)
        return path

    # -- rollouts --------------------------------------------------------------------------------
    async def _rollout(self, tasks: list[Task], samples: int, *, train: bool, temperature: float | None, label: str,
                       seed: int | None = None):
        assert self.rt is not None
        total = len(tasks) * samples
        with progress(self.console, label, total, self.cfg.train.progress_every_s) as advance:
            def done(_t):
                advance()
                if train:
                    faults.point(f"rollout:{self.step + 1}")

            traces = await self.rt.controller.rollout(tasks, samples, train=train, temperature=temperature, seed=seed,
                                                      on_done=done)
        return traces

    def _take_transfer(self) -> dict | None:
        """Driver <-> actor traffic since the last take (``placement: ray``; None when no host is remote)."""
        moved = [w.take_traffic() for w in self.rt.workers]
        if not any(w.separate_process for w in self.rt.workers):
            return None
        per = [v for m in moved for v in m.values()]
        return {"round_trips": sum(v[0] for v in per), "bytes_to_actors": sum(v[1] for v in per),
                "bytes_from_actors": sum(v[2] for v in per), "remote_call_s": sum(v[3] for v in per)}

    async def evaluate(self, label: str = "eval", tasks: list[Task] | None = None) -> dict:
        """Greedy (``eval.temperature``) scores of ``tasks`` (the held-out ones by default), with the
        EMA weights where a policy keeps them, one seed for every evaluation."""
        assert self.rt is not None
        tasks = self.eval_tasks if tasks is None else tasks
        self._take_transfer()  # a checkpoint's calls since the last step or evaluation: not this one's
        e = self.cfg.eval
        temp = e.temperature
        # every evaluation samples with the same seed: before/after differ by the weights alone;
        # policies with a weight EMA (policies.X.schedule.ema) are evaluated with it
        # async rollouts: training episodes still run; none of their calls samples while the EMA is in
        async with self.rt.controller.training_held():
            with contextlib.ExitStack() as stack:
                for w in self.rt.workers:
                    stack.enter_context(w.evaluating())
                traces = await self._rollout(tasks, e.samples_per_task, train=False, temperature=temp,
                                             label=label, seed=stable_seed(self.cfg.seed, "eval"))
        await self.rt.controller.score(traces, {t.id: t for t in tasks})  # as training scores (a failure fails its trace)
        self.last_eval_traces = traces
        summary = held_out_summary(traces)
        self._check_failures(summary, traces, f"evaluation ({label})", "no held-out figures are reported")
        if e.samples_per_task > 1:
            summary.update(sample_metrics(traces))
        for key, field, least in (("by_source", "data_source", 1), ("by_level", "level", 2), ("by_kind", "kind", 2)):
            labels = {t.id: t.meta.get(field) for t in tasks}
            if field == "kind" and all(t.meta.get("kind") == t.meta.get("data_source") for t in tasks):
                continue  # kinds that are the sources (reasoning-gym's datasets): by_source says it already
            groups = summaries_by(traces, labels, least)
            if groups:  # a mixed dataset, or tasks of several levels: each group's figures as well
                summary[key] = groups
        moved = self._take_transfer()
        if moved is not None:
            summary["transfer"] = moved
        return summary

    async def train_step(self) -> dict:
        """One synchronous step (``SyncStep``): its record for metrics.jsonl."""
        return await SyncStep(self).run()

    def async_rollouts(self) -> AsyncRollouts:
        """``rollout.mode: async``: episodes that keep running through updates, from this run's step on."""
        assert self.rt is not None
        r = self.cfg.rollout
        bounds = [p.max_staleness for p in self.cfg.policies.values() if p.max_staleness is not None]
        return AsyncRollouts(self.rt.controller, TaskStream(self.train_tasks, r.tasks_per_step, self.cfg.seed), r,
                             seed=self.cfg.seed, max_staleness=min(bounds) if bounds else None, updates=self.step)

    async def async_step(self, rollouts: AsyncRollouts) -> dict:
        """One update of the asynchronous loop; the run's step follows the updates."""
        done = await rollouts.step()
        self.step = rollouts.updates
        self.last_traces = done.traces
        done.record.update(self._take_memory())
        return done.record

    def _take_memory(self) -> dict:
        """GPU memory since the last step: ``memory`` (per GPU: peak, reserved, parts held) and
        ``gpu_peak_gib`` (the largest peak); nothing when no host has a GPU."""
        per_gpu = memory_summary([row for w in self.rt.workers for row in w.take_memory()])
        peaks = [e["peak_gib"] for e in per_gpu.values() if "peak_gib" in e]
        return {"memory": per_gpu, "gpu_peak_gib": max(peaks)} if peaks else {}

    # -- the run ---------------------------------------------------------------------------------
    async def run(self) -> dict:
        cfg = self.cfg
        loggers = build_loggers(cfg, self.run_dir)
        results: dict = {}
        budget = TimeBudget(cfg.train.time_limit_s)
        try:
            if cfg.train.eval_before and self.step == 0:
                results["before"] = await self._eval_and_log(loggers, "before", "eval before training")
            rollouts = self.async_rollouts() if cfg.rollout.mode == "async" else None
            budget.steps_begin()
            while self.step < cfg.train.steps:
                rec = await (self.async_step(rollouts) if rollouts is not None else self.train_step())
                rec["alarms"] = collapse_alarms(rec, self._first_record(rec))
                loggers.log_step(self.step, rec)
                loggers.log_traces(self.step, self.last_traces[: cfg.train.log_traces])
                self._check_failures(rec["rollout"], self.last_traces)
                self.log(step_line(self.step, cfg.train.steps, rec))
                await self._after_step(loggers)
                if self._stuck(rec, loggers) or await self._out_of_time(budget, loggers):
                    break
            if rollouts is not None:  # the episodes still running belong to no update
                await rollouts.stop()
            await self._finish(loggers, results)
        finally:
            loggers.close()
            await self.rt.controller.aclose()
        if "before" in results and "after" in results:
            self.print_comparison(results["before"], results["after"])
        results.update({k: v for k, v in (("stopped", self.stopped), ("time_limited", self.time_limited)) if v})
        return results

    async def _finish(self, loggers, results: dict) -> None:
        """The end of a run: a checkpoint of the last step, the held-out evaluation, the best weights scored."""
        cfg = self.cfg
        if cfg.train.steps and (ckpt.latest_checkpoint(self.ckpt_root) is None
                                or ckpt.latest_checkpoint(self.ckpt_root).name != f"step_{self.step:06d}"):
            self.save_checkpoint()
        if cfg.train.eval_after:
            results["after"] = await self._eval_and_log(loggers, "after", "eval after training")
            if self.best is not None and self.best.step is not None:
                results["best"] = await self.best.eval_best(self, loggers, results["after"])

    async def _out_of_time(self, budget: TimeBudget, loggers) -> bool:
        """``train.time_limit_s``: stop before the next step would end past it; the weights reached are
        validated (``keep_best``) as a last step's are."""
        why = budget.over(self.step, self.cfg.train.steps)
        if why is None:
            return False
        self.time_limited = why
        loggers.log_step(self.step, {"step": self.step, "time_limited": why})
        self.log(f"[masrl] {why}")
        if self.best is not None and not self.best.due(self.step, self.cfg.train.steps):
            await self.best.validate(self, loggers)
        return True

    def _stuck(self, rec: dict, loggers) -> bool:
        """``train.stop_when_stuck``: end the run once its last N steps had nothing to learn from."""
        why = self._stuck_watch.see(rec, self._first_record(rec))
        if why is None:
            return False
        self.stopped = f"run ended at step {self.step} of {self.cfg.train.steps}: {why}"
        loggers.log_step(self.step, {"step": self.step, "stopped": self.stopped})
        self.log(f"[masrl] {self.stopped}")
        return True

    async def _after_step(self, loggers) -> None:
        """What a step's end may bring: a checkpoint, a validation (``keep_best``), an evaluation; timed."""
        cfg, timing = self.cfg, {}
        taken = pools.refresh(cfg, self.rt.workers, self.step, self.run_dir)
        for member, source in taken.items():
            self.log(f"[masrl] step {self.step}: {member} now holds {source}'s weights (opponent pool)")
        if cfg.train.save_every and self.step % cfg.train.save_every == 0:
            t0 = time.perf_counter()
            self.save_checkpoint()
            timing["checkpoint_s"] = time.perf_counter() - t0
        if self.best is not None and self.best.due(self.step, cfg.train.steps):
            t0 = time.perf_counter()
            await self.best.validate(self, loggers)
            timing["validation_s"] = time.perf_counter() - t0
        if cfg.train.eval_every and self.step % cfg.train.eval_every == 0 and self.step < cfg.train.steps:
            t0 = time.perf_counter()
            await self._eval_and_log(loggers, "held_out", f"eval at step {self.step}")
            timing["eval_s"] = time.perf_counter() - t0
        if timing:
            loggers.log_step(self.step, {"step": self.step, "timing": timing})

    def _first_record(self, rec: dict) -> dict:
        """The run's first step record (the baseline of the collapse alarms); after a resume, read
        back from metrics.jsonl."""
        if getattr(self, "_first", None) is None:
            lines = RunDir(self.run_dir).read("metrics.jsonl")
            self._first = next((x for x in lines if "rollout" in x and "eval" not in x), rec)
        return self._first

    def write_eval_traces(self, path: Path, step: int, label: str) -> None:
        """The first ``eval.log_traces`` traces of the last evaluation, appended to ``path`` (a JSONL file)."""
        n = self.cfg.eval.log_traces
        if n and self.last_eval_traces:
            with path.open("a") as f:
                for t in self.last_eval_traces[:n]:
                    f.write(json.dumps({**t.to_dict(), "step": step, "eval": label}, default=str) + "\n")

    async def _eval_and_log(self, loggers, label: str, title: str) -> dict:
        summary = await self.evaluate(title)
        self.write_eval_traces(self.run_dir / "eval_traces.jsonl", self.step, label)
        loggers.log_eval(self.step, label, summary)
        if label in ("before", "after"):
            self._write_json(f"eval_{label}.json", summary)
        self.log(f"[masrl] held-out ({title}): {eval_line(summary)}")
        return summary

    def _check_failures(self, roll: dict, traces, what: str | None = None,
                        consequence: str = "the step's update ran on the rest") -> None:
        check_failures(roll, traces, self.cfg.rollout.max_failed_fraction, what or f"step {self.step}", consequence)

    def _write_json(self, name: str, data: dict) -> None:
        (self.run_dir / name).write_text(json.dumps(data, indent=2))

    def print_comparison(self, before: dict, after: dict) -> None:
        self.console.print(comparison_rich(before, after, f"held-out results on {len(self.eval_tasks)} unseen problems: "
                                                          f"before -> after {self.step} steps"))

def train(cfg: RunConfig, *, resume: bool = False, console: Console | None = None) -> dict:
    trainer = Trainer(cfg, console=console)
    trainer.prepare(resume=resume)
    try:
        return asyncio.run(trainer.run())
    finally:
        trainer.rt.close()


def evaluate(cfg: RunConfig, *, checkpoint: str | Path | None = None, console: Console | None = None,
             out: Path | None = None, fix: str | None = None, note: dict | None = None) -> dict:
    """The held-out figures of ``checkpoint``'s weights (the config's own weights without one). ``out``:
    a JSON file that gets them (with ``note`` beside: what was evaluated), its traces beside it
    (``NAME_traces.jsonl``). A checkpoint whose weights do not fit the config is refused before any
    model loads; ``fix`` ends that message."""
    path = ckpt.resolve_checkpoint(checkpoint) if checkpoint else None  # before any model loads
    if path is not None:
        run = RunDir.find(path)
        ckpt.check_fits(path, cfg, fix=fix or (f"evaluate the run as it was trained: masrl eval {run.path}" if run
                                                else "give the config it was trained with"))
    trainer = Trainer(cfg, console=console)
    trainer.rt = build_runtime(cfg, log=trainer.log, plan=trainer.plan)
    for name in pools.load_initial(cfg, trainer.rt.workers):  # e.g. a fixed opponent from another run
        trainer.log(f"[masrl] {name} starts from {cfg.policies[name].init_from}")
    if path is not None:
        trainer.load_checkpoint(path, with_optimizer=False)
        trainer.log(f"[masrl] evaluating {path}")

    async def go():
        try:
            summary = await trainer.evaluate()
            hook = trainer.rt.controller.hooks.yardsticks  # a game's exact measures
            if hook is not None:
                summary["yardsticks"] = await hook(trainer)
            return summary
        finally:
            await trainer.rt.controller.aclose()

    try:
        summary = asyncio.run(go())
    finally:
        trainer.rt.close()
    trainer.log(f"[masrl] held-out: {eval_line(summary)}")
    for name, a in summary.get("agents", {}).items():
        label, value = agent_result(a)
        trainer.log(f"  {name}: {'accuracy' if label == 'acc' else label} {value:.3f} format {a['format_rate']:.3f} "
                    f"reward {a['reward']:.3f} tokens {a['tokens']:.1f}")
    for line in (summary.get("yardsticks") or {}).get("lines", []):
        trainer.log(line)
    if out is not None:  # every metric, per agent and per source, as JSON, and the traces beside
        out.parent.mkdir(parents=True, exist_ok=True)
        replace_file(out, json.dumps({**(note or {}), **summary}, indent=1, default=str))
        traces = out.with_name(out.stem + "_traces.jsonl")
        traces.unlink(missing_ok=True)  # this evaluation's traces, not an earlier one's too
        trainer.write_eval_traces(traces, trainer.step, "eval")
        trainer.log(f"[masrl] wrote {out}" + (f" and {traces}" if cfg.eval.log_traces else ""))
    return summary
