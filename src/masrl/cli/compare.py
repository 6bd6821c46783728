"""``masrl compare RUN_DIR...``: does my team beat one agent? One static HTML page.

Runs are grouped into *arms* by their config's ``name`` (seeds of one config are one arm; give an
arm another name with ``name=...``); runs of one name trained with other settings (a game or a model given on
the command line) are arms of their own, labelled with what differs (``arm_names``). The arms' summary is
printed as a text table too (``compare_table``). For each arm the page draws held-out accuracy and training
outcome against the training compute spent so far, measured four ways (model calls, completion
tokens, prompt + completion tokens, wall-clock seconds of rollout and update), with the mean over
seeds and the min-max band;
and a table: held-out before -> after (mean, min-max, per seed), the compute each arm spent, its
model calls per held-out task, and how many distinct training tasks it had and how often each came
back (an arm with more tasks a step over a small pool repeats them, `data.json`). Equal compute is
read off the x axes, not assumed. Runs scored on different held-out sets are named above the table. Where the
workflow scores each agent (a game's seats: ``score``, ``win``, ``draw``, ``seat0_score``, ...), a second table
puts each arm's agents side by side at their last held-out evaluation. With ``--head-to-head N``, game runs' latest
checkpoints and the untrained model play each other N held-out games a pair (both seats) and an Elo rating is fitted
to the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from masrl.cli.page import write_page
from masrl.driver.run.rundir import read_jsonl
from masrl.errors import MasrlError

# per-agent held-out figures a workflow reports beside accuracy (a game's: docs/games.md), in the table's order
AGENT_FIGURES = ("score", "seat0_score", "seat1_score", "win", "draw", "loss", "invalid", "lost_by_invalid")


def run_curves(run_dir: Path) -> dict:
    """One run's name, seed, per-step training compute and outcomes, and its held-out evaluations."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    if not records:
        raise MasrlError(f"{run_dir}: no metrics.jsonl; give run directories of `masrl train` (runs/<name>)")
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    calls = tokens = context = seconds = rolled = 0.0
    steps, at_step = [], {0: (0.0, 0.0, 0.0, 0.0)}
    for r in records:
        if "rollout" not in r:
            continue
        rolled += r["rollout"].get("traces", 0)
        agents = r["rollout"].get("agents", {}).values()
        calls += sum(a["calls"] for a in agents)
        tokens += sum(a["calls"] * a["tokens"] for a in agents)
        # prompt + completion: what long prompts cost (runs from before prompt_tokens was logged count completions)
        context += sum(a["calls"] * (a.get("prompt_tokens", 0.0) + a["tokens"]) for a in agents)
        seconds += r.get("rollout_s", 0.0) + r.get("update_s", 0.0)
        at_step[r["step"]] = (calls, tokens, context, seconds)
        steps.append({"step": r["step"], "calls": calls, "tokens": tokens, "context": context, "seconds": seconds,
                      "outcome": r["rollout"].get("outcome")})
    evals, best = [], None
    for r in records:
        if r.get("eval") == "best" and r["step"] in at_step:  # held-out at the best-by-validation weights
            best = {"step": r["step"], "accuracy": r.get("outcome"), "validation": r.get("validation")}
        if "eval" in r and r["eval"] not in ("validation", "best") and r["step"] in at_step:
            c, t, x, s = at_step[r["step"]]
            per_task = sum(a.get("calls", 0) for a in r.get("agents", {}).values()) / max(1, r.get("traces", 1))
            evals.append({"step": r["step"], "label": r["eval"], "calls": c, "tokens": t, "context": x, "seconds": s,
                          "accuracy": r.get("outcome"), "calls_per_task": per_task})
    last = next((r for r in reversed(records) if "eval" in r and r["eval"] not in ("validation", "best")), None)
    agents = {a: {k: m[k] for k in AGENT_FIGURES if isinstance(m.get(k), (int, float))}
              for a, m in (last or {}).get("agents", {}).items()}
    out = {"dir": str(run_dir), "name": cfg.get("name", run_dir.name), "seed": cfg.get("seed"), "steps": steps,
           "config": {k: v for k, v in cfg.items() if k not in PER_RUN},
           "evals": evals, "best": best, "agents_last": {a: f for a, f in agents.items() if f}}
    yard = yardsticks_of(run_dir)
    if yard:
        out["yardsticks"] = yard
    data = run_dir / "data.json"  # what the splits held (runs since 2026-12-04)
    if data.is_file():
        d = json.loads(data.read_text())
        samples = (cfg.get("rollout") or {}).get("samples_per_task") or 1
        out["data"] = {"train_tasks": d["train_tasks"], "held_out_tasks": d["held_out_tasks"],
                       "held_out_mix": d["held_out_mix"], "draws": rolled / samples}
    return out


def yardsticks_of(run_dir: Path) -> dict:
    """The exact yardsticks of the run's newest ``masrl eval`` (RUN/evals/*.json) that has them: exploitability, and
    each ladder rung's score per seat (win 1, draw 0.5)."""
    found = []
    for p in (run_dir / "evals").glob("*.json") if (run_dir / "evals").is_dir() else []:
        try:
            y = json.loads(p.read_text()).get("yardsticks")
        except (OSError, ValueError):
            continue
        if y:
            found.append((p.stat().st_mtime, p.name, y))
    if not found:
        return {}
    _, name, y = max(found)
    out: dict = {"eval": name}
    if y.get("exploitability"):
        out["exploitability"] = y["exploitability"]["policy"]
        out["exploitability_uniform"] = y["exploitability"]["uniform"]
    for p, seats in ((y.get("ladder") or {}).get("random_move_probability") or {}).items():
        for seat, r in seats.items():
            out[f"minimax@{p}/{seat}"] = r["win"] + 0.5 * r["draw"]
    return out


def _spread(values: list[float]) -> dict:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values), "values": values}


def agent_figures(runs: list[dict]) -> dict:
    """Each agent's figures at its seeds' last held-out evaluation, spread over the seeds that report them."""
    figures: dict[str, dict[str, list[float]]] = {}  # agent -> figure -> one value per seed that has it
    for r in runs:
        for agent, got in r.get("agents_last", {}).items():
            for k, v in got.items():
                figures.setdefault(agent, {}).setdefault(k, []).append(v)
    return {a: {k: _spread(v) for k, v in f.items()} for a, f in figures.items()}


def _yardstick_spread(runs: list[dict]) -> dict:
    """Each yardstick over the seeds that have it."""
    yard: dict[str, list[float]] = {}
    for r in runs:
        for k, v in (r.get("yardsticks") or {}).items():
            if isinstance(v, (int, float)):
                yard.setdefault(k, []).append(v)
    return {k: _spread(v) for k, v in yard.items()}


def arm_summary(runs: list[dict]) -> dict:
    """Held-out before and after (the first and last evaluation of each seed) and compute spent."""
    def pick(run, which):
        ev = [e for e in run["evals"] if e["accuracy"] is not None]
        return (ev[0] if which == "first" else ev[-1]) if ev else None

    out: dict = {"seeds": [r["seed"] for r in runs], "runs": len(runs)}
    for which in ("first", "last"):
        got = [pick(r, which) for r in runs]
        if all(got):
            out[f"heldout_{which}"] = _spread([g["accuracy"] for g in got])
            out[f"heldout_{which}_step"] = [g["step"] for g in got]
            out[f"calls_per_task_{which}"] = _spread([g["calls_per_task"] for g in got])
    if all(r.get("best") and r["best"]["accuracy"] is not None for r in runs):  # train.keep_best in every seed
        out["heldout_best"] = _spread([r["best"]["accuracy"] for r in runs])
        out["heldout_best_step"] = [r["best"]["step"] for r in runs]
    for key in ("calls", "tokens", "context", "seconds"):
        finals = [r["steps"][-1][key] for r in runs if r["steps"]]
        if finals:
            out[f"train_{key}"] = _spread(finals)
    figures = agent_figures(runs)
    if figures:
        out["agents_last"] = figures
    yard = _yardstick_spread(runs)
    if yard:
        out["yardsticks"] = yard
    if all("data" in r and r["data"]["train_tasks"] for r in runs):  # how often a training task came back
        out["train_tasks"] = _spread([r["data"]["train_tasks"] for r in runs])
        out["draws_per_task"] = _spread([r["data"]["draws"] / r["data"]["train_tasks"] for r in runs])
    return out


def held_out_notes(arms: dict[str, list[dict]]) -> list[str]:
    """Why the arms' held-out figures may not compare: runs scored on held-out sets of other sizes or mixes."""
    sets = {(r["data"]["held_out_tasks"], json.dumps(r["data"]["held_out_mix"], sort_keys=True)): f"{name} seed {r['seed']}"
            for name, rs in arms.items() for r in rs if "data" in r}
    if len(sets) < 2:
        return []
    return ["The runs were scored on different held-out sets (" + "; ".join(
        f"{who}: {n} tasks, {', '.join(f'{k} {v:.0%}' for k, v in json.loads(m).items()) or 'no kinds'}"
        for (n, m), who in sets.items()) + "): compare them on one held-out set"]


PER_RUN = ("seed", "output_dir", "threads")  # what the seeds of one arm may differ in


def _flat(d, prefix: str = "") -> dict[str, object]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, object] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def arm_names(runs: list[dict]) -> list[str]:
    """Each run's arm: its config's ``name``, and where runs of one name were trained with other settings (a
    game or a model given on the command line), those settings too, so that they are not filed as seeds of one
    arm (``tictactoe_selfplay (workflow.options.game=ConnectFour-v0)``)."""
    variants: dict[str, list[dict]] = {}
    for r in runs:
        flat = _flat(r.get("config", {}))
        known = variants.setdefault(r["name"], [])
        if flat not in known:
            known.append(flat)
    out = []
    for r in runs:
        known = variants[r["name"]]
        flat = _flat(r.get("config", {}))
        if flat == known[0]:
            out.append(r["name"])
            continue
        diff = [f"{k}={flat.get(k)}" for k in sorted(set(flat) | set(known[0])) if flat.get(k) != known[0].get(k)]
        out.append(f"{r['name']} ({', '.join(diff[:3])}{', ...' if len(diff) > 3 else ''})")
    return out


def collect_runs(run_dirs: list[str | Path]) -> dict:
    runs = []
    for d in run_dirs:
        d = Path(d)
        if not d.is_dir():
            raise MasrlError(f"run directory '{d}' does not exist")
        runs.append(run_curves(d))
    arms: dict[str, list[dict]] = {}
    for name, run in zip(arm_names(runs), runs):
        arms.setdefault(name, []).append(run)
    return {"arms": [{"name": n, "runs": rs, "summary": arm_summary(rs)} for n, rs in arms.items()],
            "notes": held_out_notes(arms)}


def _figure(s: dict, key: str) -> str:
    got = s.get(key)
    if not got:
        return "-"
    spread = f" ({got['min']:.3f}-{got['max']:.3f})" if len(got["values"]) > 1 else ""
    return f"{got['mean']:.3f}{spread}"


def compare_table(data: dict) -> list[str]:
    """The page's summary as a text table for the terminal: one row per arm, mean over its seeds (range)."""
    rows = [["arm", "seeds", "held-out first", "held-out last", "best-by-validation", "training calls"]]
    for arm in data["arms"]:
        s = arm["summary"]
        seeds = ",".join(str(x) for x in s["seeds"])
        calls = f"{s['train_calls']['mean']:.0f}" if "train_calls" in s else "-"
        rows.append([arm["name"], seeds, _figure(s, "heldout_first"), _figure(s, "heldout_last"),
                     _figure(s, "heldout_best"), calls])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:], *yardstick_lines(data), *data.get("notes", [])]


def yardstick_lines(data: dict) -> list[str]:
    """Each arm's exact yardsticks (``masrl eval`` of its runs): mean over its seeds (range)."""
    out = []
    for arm in data["arms"]:
        y = arm["summary"].get("yardsticks") or {}
        if not y:
            continue
        cells = [f"{k} {_figure(y, k)}" for k in sorted(y) if k != "exploitability_uniform"]
        if "exploitability_uniform" in y:
            cells.append(f"(uniform {y['exploitability_uniform']['mean']:.3f})")
        out.append(f"yardsticks {arm['name']}: " + ", ".join(cells))
    return out


def head_to_head_of(run_dirs: list[str | Path], games: int, overrides: list[str] | None = None, log=None) -> dict:
    """The runs' latest checkpoints against each other (the ``head_to_head`` comparison a task family adds: the games
    family's, on the first run's config)."""
    from masrl.driver.run.rundir import RunDir
    from masrl.families import COMPARISONS

    if "head_to_head" not in COMPARISONS:
        raise MasrlError("masrl compare --head-to-head: no task family adds a head-to-head comparison")
    runs = [RunDir(d) for d in run_dirs]
    return COMPARISONS["head_to_head"].run([(r.path.name, r.config_file, r.checkpoint()) for r in runs], games,
                                           list(overrides or []), log)


def build_compare(run_dirs: list[str | Path], out: str | Path, print_table=None, head_to_head_games: int = 0,
                  overrides: list[str] | None = None) -> Path:
    """The page; ``print_table``: a function that gets the text table's lines (the terminal's);
    ``head_to_head_games``: game runs' checkpoints also play each other that many held-out games a pair."""
    if not run_dirs:
        raise MasrlError("masrl compare: give one or more run directories")
    data = collect_runs(run_dirs)
    if head_to_head_games:
        from masrl.families import COMPARISONS

        data["head_to_head"] = head_to_head_of(run_dirs, head_to_head_games, overrides, log=print_table)
        data["notes"] = [*data.get("notes", []), *COMPARISONS["head_to_head"].lines(data["head_to_head"])]
    if print_table is not None:
        for line in compare_table(data):
            print_table(line)
    return write_page(out, title="masrl compare", body=_BODY, script=_SCRIPT, data=data,
                      style="td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}")


_BODY = """<h1>masrl compare: held-out accuracy against training compute</h1>
<div class="muted">Each arm is one config name over its seeds: the line is the mean over seeds, the band the min-max.
Compute counts model calls, completion tokens, prompt + completion tokens and rollout + update seconds spent in
training so far.</div>
<h2>Summary</h2><div id="notes"></div><table id="summary"></table>
<div id="agents_box" hidden><h2>Per agent, at the last held-out evaluation</h2>
<div class="muted">Each agent's own figures (a game's seats: score is win 1, draw 0.5; seat0_score and seat1_score
the same in the first and second seat; invalid the share of its moves the game refused): mean over seeds
(min-max).</div><table id="agents"></table></div>
<div id="yard_box" hidden><h2>Exact yardsticks</h2>
<div class="muted">From each run's newest <code>masrl eval</code> (an OpenSpiel game): exploitability (0 is Nash) and
the score against minimax players that move at random with probability p, per seat; mean over seeds (min-max).</div>
<table id="yard"></table></div>
<div id="h2h_box" hidden><h2>Head to head</h2>
<div class="muted">Each run's latest checkpoint and the untrained model against each other on the first run's held-out
games, both seats: the row's score against the column (win 1, draw 0.5), and an Elo rating fitted to the table
(mean 1000).</div><table id="h2h"></table></div>
<h2>Held-out accuracy</h2><div class="charts" id="heldout"></div>
<h2>Training outcome</h2><div class="charts" id="training"></div>"""

_SCRIPT = r"""const f3=v=>v===undefined||v===null?'-':(+v).toFixed(3), big=v=>v===undefined?'-':Math.round(v).toLocaleString();
// points of one arm: per index i (the i-th step or evaluation of every seed), x and y mean and y min-max
function band(runs,list,xkey,ykey){const n=Math.min(...runs.map(r=>r[list].length));const out=[];
  for(let i=0;i<n;i++){const xs=runs.map(r=>r[list][i][xkey]),ys=runs.map(r=>r[list][i][ykey]).filter(v=>v!==null&&v!==undefined);
    if(!ys.length)continue; out.push([xs.reduce((a,b)=>a+b)/xs.length,ys.reduce((a,b)=>a+b)/ys.length,Math.min(...ys),Math.max(...ys)]);}
  return out;}
function chart(parent,title,series){const W=400,H=210,P=36,box=el('div',{class:'chart'});box.appendChild(el('div',{class:'title'},title));
  const svg=sv('svg',{width:W,height:H,'data-title':title});const pts=[].concat(...series.map(s=>s.points));
  if(pts.length){let x0=Math.min(...pts.map(p=>p[0])),x1=Math.max(...pts.map(p=>p[0])),y0=Math.min(...pts.map(p=>p[2])),y1=Math.max(...pts.map(p=>p[3]));
    if(x1===x0)x1=x0+1;if(y1===y0){y1=y0+1;y0=y0-1;}
    const X=x=>P+(x-x0)/(x1-x0)*(W-P-8),Y=y=>H-22-(y-y0)/(y1-y0)*(H-34);
    svg.appendChild(sv('path',{d:`M${P},8V${H-22}H${W-8}`,stroke:'#999',fill:'none'}));
    for(const [v,y] of [[y1,Y(y1)],[y0,Y(y0)]]){const t=sv('text',{x:2,y:y+4,'font-size':10});t.textContent=(+v).toPrecision(3);svg.appendChild(t);}
    const tx=sv('text',{x:W-150,y:H-6,'font-size':10});tx.textContent=big(x0)+' – '+big(x1);svg.appendChild(tx);
    series.forEach((s,i)=>{const c=COLORS[i%COLORS.length];if(!s.points.length)return;
      const poly=s.points.map(p=>X(p[0])+','+Y(p[3])).concat(s.points.slice().reverse().map(p=>X(p[0])+','+Y(p[2])));
      svg.appendChild(sv('polygon',{points:poly.join(' '),fill:c,'fill-opacity':0.15,stroke:'none','data-band':s.name}));
      svg.appendChild(sv('polyline',{points:s.points.map(p=>X(p[0])+','+Y(p[1])).join(' '),fill:'none',stroke:c,'stroke-width':1.8,'data-series':s.name}));});
  } else {const t=sv('text',{x:20,y:40});t.textContent='no data';svg.appendChild(t);}
  box.appendChild(svg);legend(box,series);parent.appendChild(box);}
const T=document.getElementById('summary');
T.appendChild(el('tr')).append(...['arm','seeds','held-out first -> last (min-max)','per seed (last)','at the best-by-validation checkpoint (steps)','training calls','training tokens (completion)','training tokens (prompt + completion)','training seconds','calls per held-out task','training tasks (draws of each)'].map(h=>el('th',{},h)));
for(const n of D.notes)document.getElementById('notes').appendChild(el('p',{class:'note'},n));
for(const a of D.arms){const s=a.summary,f=s.heldout_first,l=s.heldout_last,tr=el('tr');
  tr.append(el('td',{},a.name),el('td',{},s.seeds.join(', ')),
    el('td',{},f&&l?`${f3(f.mean)} -> ${f3(l.mean)} (${f3(l.min)}-${f3(l.max)})`:'no held-out evaluation'),
    el('td',{},l?l.values.map(f3).join(', '):'-'),
    el('td',{},s.heldout_best?`${f3(s.heldout_best.mean)} (${f3(s.heldout_best.min)}-${f3(s.heldout_best.max)}; steps ${s.heldout_best_step.join(', ')})`:'-'),
    el('td',{},s.train_calls?big(s.train_calls.mean):'-'),
    el('td',{},s.train_tokens?big(s.train_tokens.mean):'-'),el('td',{},s.train_context?big(s.train_context.mean):'-'),
    el('td',{},s.train_seconds?(+s.train_seconds.mean).toFixed(1):'-'),
    el('td',{},s.calls_per_task_last?(+s.calls_per_task_last.mean).toFixed(2):'-'),
    el('td',{},s.train_tasks?`${big(s.train_tasks.mean)} (${(+s.draws_per_task.mean).toFixed(1)})`:'-'));T.appendChild(tr);}
const FIG=['score','seat0_score','seat1_score','win','draw','loss','invalid','lost_by_invalid'],A=document.getElementById('agents');
const shown=FIG.filter(k=>D.arms.some(a=>Object.values(a.summary.agents_last||{}).some(f=>f[k])));
if(shown.length){document.getElementById('agents_box').hidden=false;
  A.appendChild(el('tr')).append(...['arm','agent'].concat(shown).map(h=>el('th',{},h)));
  for(const a of D.arms)for(const [agent,f] of Object.entries(a.summary.agents_last||{})){const tr=el('tr',{'data-agent':a.name+'/'+agent});
    tr.append(el('td',{},a.name),el('td',{},agent),...shown.map(k=>el('td',{},f[k]?`${f3(f[k].mean)} (${f3(f[k].min)}-${f3(f[k].max)})`:'-')));A.appendChild(tr);}}
const YK=[...new Set([].concat(...D.arms.map(a=>Object.keys(a.summary.yardsticks||{}))))].sort(),Y=document.getElementById('yard');
if(YK.length){document.getElementById('yard_box').hidden=false;Y.appendChild(el('tr')).append(...['arm'].concat(YK).map(h=>el('th',{},h)));
  for(const a of D.arms){const y=a.summary.yardsticks||{},tr=el('tr',{'data-yard':a.name});
    tr.append(el('td',{},a.name),...YK.map(k=>el('td',{},y[k]?`${f3(y[k].mean)} (${f3(y[k].min)}-${f3(y[k].max)})`:'-')));Y.appendChild(tr);}}
if(D.head_to_head){const H=D.head_to_head,B=document.getElementById('h2h');document.getElementById('h2h_box').hidden=false;
  B.appendChild(el('tr')).append(...['', ...H.names, 'Elo'].map(h=>el('th',{},h)));
  for(const r of H.names){const tr=el('tr',{'data-h2h':r});tr.append(el('td',{},r),...H.names.map(c=>el('td',{},f3(H.table[r][c]))),
    el('td',{},Math.round(H.elo[r]).toString()));B.appendChild(tr);}}
for(const [key,label] of [['calls','model calls'],['tokens','completion tokens'],['context','prompt + completion tokens'],['seconds','seconds']]){
  chart(document.getElementById('heldout'),'held-out accuracy vs training '+label,D.arms.map(a=>({name:a.name,points:band(a.runs,'evals',key,'accuracy')})));
  chart(document.getElementById('training'),'training outcome vs '+label,D.arms.map(a=>({name:a.name,points:band(a.runs,'steps',key,'outcome')})));}
"""
