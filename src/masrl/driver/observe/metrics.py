"""Summaries of traces and updates, the metrics.jsonl writer, and the console lines."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from masrl.errors import MasrlError
from masrl.trace import Trace


def distinct_n(texts: list[str], n: int) -> float:
    """Distinct n-grams over all n-grams of ``texts`` (whitespace tokens): 1.0 when no n-gram
    repeats, near 0 when every completion says the same thing. A text shorter than ``n`` tokens
    counts as one gram of its own (a one-word answer such as ``<answer>42</answer>`` would
    otherwise have no bigram, and a finalizer's distinct-2 read 0.0 however varied its answers)."""
    return _distinct([t.split() for t in texts], n)


def _distinct(split: list[list[str]], n: int) -> float:
    seen: set = set()
    count = 0
    for toks in split:
        if 0 < len(toks) < n:
            seen.add(tuple(toks))
            count += 1
        elif len(toks) >= n:
            grams = toks if n == 1 else zip(*(toks[i:] for i in range(n)))
            seen.update(grams)
            count += len(toks) - n + 1
    return len(seen) / count if count else 0.0


def diversity(calls) -> dict[str, float]:
    split = [(c.completion or "").split() for c in calls]  # once for both (a step's summary holds every call)
    return {"distinct_1": _distinct(split, 1), "distinct_2": _distinct(split, 2)}


def summarize_traces(traces: list[Trace]) -> dict:
    """Per-run and per-agent figures over the traces that did not fail."""
    ok = [t for t in traces if not t.failed]
    out: dict = {"traces": len(traces), "failed": len(traces) - len(ok)}
    errors = [t.error for t in traces if t.failed]
    if errors:
        out["first_error"] = errors[0]
    if not ok:
        out["agents"] = {}
        return out
    run_metrics, own = _workflow_metrics(ok)
    out.update(run_metrics)
    out["agents"] = _agent_figures(ok, own)
    by_policy: dict[str, list] = defaultdict(list)
    for t in ok:
        for c in t.calls:
            by_policy[c.policy].append(c)
    out["policies"] = {p: {"calls": len(cs), **diversity(cs)} for p, cs in sorted(by_policy.items())}
    out["reward"] = mean(c.reward or 0.0 for t in ok for c in t.calls) if any(t.calls for t in ok) else 0.0
    return out


def held_out_summary(traces: list[Trace]) -> dict:
    """``summarize_traces`` for an evaluation: a task whose trace failed scores 0 in ``outcome`` (a held-out
    score never drops what it could not finish); ``outcome_ran`` is the mean over the traces that ran."""
    out = summarize_traces(traces)
    if out["failed"] and "outcome" in out:
        out["outcome_ran"] = out["outcome"]
        out["outcome"] = out["outcome"] * (out["traces"] - out["failed"]) / out["traces"]
    elif out["failed"]:
        out["outcome"] = 0.0
    return out


def _workflow_metrics(ok: list[Trace]) -> tuple[dict[str, float], dict[str, dict[str, list[float]]]]:
    """The workflow's own metrics: run-wide ones (their mean over the traces, 0 where a trace has
    none), and ``<agent>/<metric>`` ones by agent (the values of the traces that have them)."""
    keys = sorted({k for t in ok for k in t.metrics})
    agent_names = {c.agent for t in ok for c in t.calls}
    run: dict[str, float] = {}
    own: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for k in keys:
        agent, _, metric = k.partition("/")
        if metric and agent in agent_names:
            own[agent][metric] += [float(t.metrics[k]) for t in ok if k in t.metrics]
        else:
            run[k] = mean(float(t.metrics.get(k, 0.0)) for t in ok)
    return run, own


def zero_variance_groups(ok: list[Trace]) -> dict[str, float]:
    """Per agent: the share of its groups (calls with the same task, agent and turn across the
    samples, the default GRPO group) whose rewards are all equal, so that they teach nothing."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for t in ok:
        for c in t.calls:
            if c.reward is not None:
                groups[(t.task_id, c.agent, c.turn)].append(c.reward)
    flat: dict[str, list[bool]] = defaultdict(list)
    for (_, agent, _), rewards in groups.items():
        if len(rewards) > 1:
            flat[agent].append(max(rewards) - min(rewards) < 1e-9)
    return {a: sum(v) / len(v) for a, v in flat.items()}


def _agent_figures(ok: list[Trace], own: dict[str, dict[str, list[float]]]) -> dict[str, dict]:
    zero_var = zero_variance_groups(ok)
    by_agent: dict[str, list] = defaultdict(list)
    outcome_by_agent: dict[str, list[float]] = defaultdict(list)  # once per trace the agent took part in
    for t in ok:
        for c in t.calls:
            by_agent[c.agent].append(c)
        for agent in dict.fromkeys(c.agent for c in t.calls):
            outcome_by_agent[agent].append(float(t.metrics.get("outcome", 0.0)))
    agents = {}
    for name, calls in by_agent.items():
        agents[name] = {
            "reward": mean(c.reward or 0.0 for c in calls),
            "accuracy": mean(outcome_by_agent[name]),
            "format_rate": mean(1.0 if c.format_ok else 0.0 for c in calls),
            "format_score": mean(c.format_score for c in calls),
            "tokens": mean(c.n_completion_tokens for c in calls),
            "prompt_tokens": mean(c.n_prompt_tokens for c in calls),
            "calls": len(calls),
            **diversity(calls),
        }
        if name in zero_var:
            agents[name]["zero_var_groups"] = zero_var[name]
        for metric, values in own.get(name, {}).items():  # what the workflow judges this agent on
            agents[name][metric] = mean(values)
    return agents


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def sample_metrics(traces: list[Trace]) -> dict:
    """pass@1, pass@k and maj@k over the samples of each task (k = samples per task), averaged.

    maj@k: the most common final answer among a task's samples (ties: the first seen), scored by
    the outcome of a sample that gave it."""
    by_task: dict[str, list[Trace]] = defaultdict(list)
    for t in traces:
        if not t.failed:
            by_task[t.task_id].append(t)
    if not by_task:
        return {}
    k = max(len(v) for v in by_task.values())
    p1, pk, maj = [], [], []
    for ts in by_task.values():
        n, c = len(ts), sum(1 for t in ts if float(t.metrics.get("outcome", 0.0)) >= 1.0)
        p1.append(c / n)
        pk.append(pass_at_k(n, c, min(k, n)))
        counts: dict[str, list[Trace]] = {}
        for t in ts:
            counts.setdefault(str(t.final_answer).strip(), []).append(t)
        best = max(counts.values(), key=len)
        maj.append(float(best[0].metrics.get("outcome", 0.0)))
    return {"k": k, "pass@1": mean(p1), f"pass@{k}": mean(pk), f"maj@{k}": mean(maj)}


LINE = 240  # a step line longer than this puts each agent, policy and alarm on a line of its own


def agent_result(a: dict) -> tuple[str, float]:
    """What an agent is judged by on the console: its own ``score`` where the workflow gives one (a game's
    player: its own result, not the first seat's), else the accuracy of the traces it took part in."""
    return ("score", a["score"]) if "score" in a else ("acc", a.get("accuracy", 0.0))


def step_line(step: int, total: int, rec: dict) -> str:
    """The console's line for a step; a team's (past ``LINE`` characters) wraps, one agent, policy or alarm
    to an indented line."""
    r = rec["rollout"]
    parts = [f"step {step}/{total}", f"rollout {rec['rollout_s']:.1f}s update {rec['update_s']:.1f}s",
             f"outcome {r.get('outcome', 0.0):.3f}", f"reward {r.get('reward', 0.0):.3f}"]
    if r.get("failed"):
        parts.append(f"failed {r['failed']}")
    if "gpu_peak_gib" in rec:
        parts.append(f"gpu peak {rec['gpu_peak_gib']:.1f} GiB")
    pools = [e for e in rec.get("memory", {}).values() if "engine_pool_peak" in e]
    if pools:
        pre = sum(e["engine_preemptions"] for e in pools)
        parts.append(f"kv pool {max(e['engine_pool_peak'] for e in pools):.0%}"
                     + (f", {pre:.0f} pre-empted (raise rollout.gpu_memory_utilization)" if pre else ""))
    head = len(parts)
    for name, a in r.get("agents", {}).items():
        label, value = agent_result(a)
        parts.append(f"{name}: r={a['reward']:.2f} {label}={value:.2f} fmt={a['format_rate']:.2f} tok={a['tokens']:.0f}")
    for name, p in rec.get("policies", {}).items():
        parts.append(f"[{name}] loss={p['loss']:.4f} kl={p['kl']:.4f} gn={p['grad_norm']:.2f} "
                     f"skip={p['skipped_zero_adv']:.0f}/{p['n_seqs']:.0f} "
                     f"dlogp={p.get('lp_mismatch', 0.0):.1e}/{p.get('lp_mismatch_max', 0.0):.1e}")
    for alarm in rec.get("alarms", []):
        parts.append(f"ALARM {alarm}")
    line = " | ".join(parts)
    if len(line) <= LINE:
        return line
    return " | ".join(parts[:head]) + "".join(f"\n    {p}" for p in parts[head:])


def comparison_table(before: dict, after: dict) -> list[list[str]]:
    rows = [["", "accuracy", "format rate", "mean reward"]]

    def row(label, b, a, key):
        if b is None or a is None:
            return f"{(a or b or {}).get(key, 0.0):.3f}"
        return f"{b.get(key, 0.0):.3f} -> {a.get(key, 0.0):.3f}"

    rows.append(["all agents", f"{before.get('outcome', 0):.3f} -> {after.get('outcome', 0):.3f}",
                 f"{_mean_fmt(before):.3f} -> {_mean_fmt(after):.3f}",
                 f"{before.get('reward', 0):.3f} -> {after.get('reward', 0):.3f}"])
    for name in after.get("agents", {}):
        b, a = before.get("agents", {}).get(name), after["agents"][name]
        key = "score" if "score" in a else "accuracy"  # a game's player: its own result
        rows.append([name, row(name, b, a, key), row(name, b, a, "format_rate"), row(name, b, a, "reward")])
    return rows


def _mean_fmt(summary: dict) -> float:
    agents = summary.get("agents", {})
    return mean(a["format_rate"] for a in agents.values()) if agents else 0.0


def summaries_by(traces: list[Trace], label_of: dict[str, Any], least: int) -> dict[str, dict]:
    """``summarize_traces`` for each group of traces, grouped by their task's label (``label_of``:
    task id -> label, None for none); empty unless at least ``least`` distinct labels are present."""
    if len(set(label_of.values()) - {None}) < least:
        return {}
    groups: dict[str, list[Trace]] = {}
    for tr in traces:
        label = label_of.get(tr.task_id)
        groups.setdefault("unknown" if label is None else str(label), []).append(tr)
    return {label: summarize_traces(trs) for label, trs in sorted(groups.items())}


MEMORY_PARTS = ("weights", "weight_copy", "optimizer", "engine_kv", "engine_weights", "engine_buffers")


def memory_summary(rows: list[dict]) -> dict:
    """The hosts' ``take_memory`` rows -> one entry per GPU (per process and device: hosts in one
    process share a device's counters): its step peak and reserved memory in GiB, and the parts
    its hosts hold, summed. Keyed by device, or ``device@pid`` when several processes report."""
    by: dict[tuple, dict] = {}
    for r in rows:
        e = by.setdefault((r["process"], r["device"]), {k: 0.0 for k in MEMORY_PARTS})
        for k in MEMORY_PARTS:
            e[k] += r.get(k, 0.0)
        if "engine_pool_peak" in r:  # paged engines: pre-emptions add up, the fullest pool counts
            e["engine_preemptions"] = e.get("engine_preemptions", 0.0) + r["engine_preemptions"]
            e["engine_pool_peak"] = max(e.get("engine_pool_peak", 0.0), r["engine_pool_peak"])
        for k in ("peak_gib", "reserved_gib"):
            if k in r:
                e[k] = r[k]
    several = len({pid for pid, _ in by}) > 1
    return {(f"{dev}@{pid}" if several else dev): e for (pid, dev), e in sorted(by.items(), key=lambda kv: kv[0][1])}


def eval_line(s: dict) -> str:
    """A held-out summary in one line (and one line per source or level group)."""
    line = f"accuracy {s.get('outcome', 0):.3f}, mean reward {s.get('reward', 0):.3f}, failed {s.get('failed', 0)}"
    if s.get("failed"):
        line += (f" (each counted as 0; {s.get('outcome_ran', 0):.3f} over the {s['traces'] - s['failed']} that ran; "
                 f"first: {str(s.get('first_error', ''))[:300]})")
    if "k" in s:
        k = s["k"]
        line += f", pass@1 {s['pass@1']:.3f}, pass@{k} {s[f'pass@{k}']:.3f}, maj@{k} {s[f'maj@{k}']:.3f}"
    for src, b in s.get("by_source", {}).items():
        line += f"\n  {src}: accuracy {b.get('outcome', 0):.3f}, mean reward {b.get('reward', 0):.3f} ({b['traces']} traces)"
    for key, what in (("by_level", "level"), ("by_kind", "kind")):
        if key in s:
            line += f"\n  by {what}: " + ", ".join(f"{g} {b.get('outcome', 0):.3f} ({b['traces']})" for g, b in s[key].items())
    return line


def check_failures(roll: dict, traces, limit: float, what: str, consequence: str) -> None:
    """Stop (``MasrlError``) when more of a step's or an evaluation's traces than ``limit``
    (``rollout.max_failed_fraction``) failed: an accuracy over the few traces that ran would be no result."""
    if roll["traces"] and roll["failed"] > limit * roll["traces"]:
        errors = [t.error for t in traces if t.failed][:3]
        raise MasrlError(f"{what}: {roll['failed']} of {roll['traces']} traces failed (more than "
                         f"rollout.max_failed_fraction={limit:g}); {consequence}. First errors:"
                         + "".join(f"\n  - {e}" for e in errors) + memory_hint(errors))


def memory_hint(errors) -> str:
    """A line for failures that are the GPU running out of memory (another run on the device, or this
    run's own update, took it): the settings that bound a run's memory. Empty for any other failure."""
    from masrl.worker.model.memory import memory_failure  # (torch: imported only once traces failed)

    if not any(e and memory_failure(e) for e in errors):
        return ""
    return ("\n  These are GPU memory failures: the device had no memory left when the engine needed it (other "
            "processes on it, or this run's own update). Lower algorithm.micro_batch_tokens or "
            "rollout.gpu_memory_utilization, or run fewer runs on the GPU (docs/gpu.md: what a run holds).")


def comparison_rich(before: dict, after: dict, title: str):
    """``comparison_table`` as a rich table, for the console."""
    from rich.table import Table

    rows = comparison_table(before, after)
    table = Table(title=title)
    for h in rows[0]:
        table.add_column(h or "agent")
    for r in rows[1:]:
        table.add_row(*r)
    return table
