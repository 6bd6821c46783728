"""``masrl report RUN_DIR``: one static HTML file (no server, no network) to look at a run.

Curves per agent (reward, accuracy, format rate) and per policy (loss, KL, clip fraction,
entropy, grad norm, logprob gap), the step-time breakdown, held-out curves, and a trace browser:
pick a step and a task and read every call of every logged sample in order — agent, policy, turn,
prompt, completion, parsed fields, tool calls, the reward and its parts, the advantage it was
trained with. The data (from ``metrics.jsonl`` and ``traces.jsonl``) is embedded as JSON and drawn
by a small script: inline SVG, no libraries. To stay small for long runs it keeps the traces of at
most ``max_steps`` steps (evenly spread, the last included) and cuts texts to ``max_chars``; the
page says so.
"""

from __future__ import annotations

from pathlib import Path

from masrl.cli.page import write_page
from masrl.driver.run.rundir import read_jsonl
from masrl.errors import MasrlError


def _cut(value, n: int):
    if isinstance(value, str):
        return value if len(value) <= n else value[:n] + f"... [{len(value) - n} more characters]"
    if isinstance(value, list):
        return [_cut(v, n) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v, n) for k, v in value.items()}
    return value


def collect(run_dir: Path, *, max_steps: int = 50, max_chars: int = 4000) -> dict:
    records = read_jsonl(run_dir / "metrics.jsonl")
    if not records:
        raise MasrlError(f"{run_dir} has no metrics.jsonl: is it a masrl run directory (runs/<name>)?")
    steps = [r for r in records if "rollout" in r]
    evals = [r for r in records if "eval" in r]
    timing = {r["step"]: r["timing"] for r in records if "timing" in r}
    traces = read_jsonl(run_dir / "traces.jsonl")
    trace_steps = sorted({t["step"] for t in traces})
    keep = set(trace_steps)
    if len(trace_steps) > max_steps:
        idx = {round(i * (len(trace_steps) - 1) / (max_steps - 1)) for i in range(max_steps)}
        keep = {trace_steps[i] for i in idx}
    kept = [{**_cut(t, max_chars), "view": f"step {t['step']}"} for t in traces if t["step"] in keep]
    held_out = read_jsonl(run_dir / "eval_traces.jsonl")  # what the agents answered on tasks never trained on
    shown = list(dict.fromkeys((t.get("step", 0), str(t.get("eval", "eval"))) for t in held_out))
    if len(shown) > max_steps:
        shown = [shown[round(i * (len(shown) - 1) / (max_steps - 1))] for i in range(max_steps)]
    kept += [{**_cut(t, max_chars), "view": f"held-out, {t.get('eval', 'eval')}, step {t.get('step', 0)}"}
             for t in held_out if (t.get("step", 0), str(t.get("eval", "eval"))) in set(shown)]
    config = (run_dir / "config.yaml").read_text(encoding="utf-8") if (run_dir / "config.yaml").is_file() else ""
    return {
        "name": run_dir.name,
        "config": config,
        "steps": [{"step": r["step"], "rollout_s": r.get("rollout_s", 0.0), "update_s": r.get("update_s", 0.0),
                   **{f"{k}": v for k, v in timing.get(r["step"], {}).items()},
                   "agents": r["rollout"].get("agents", {}), "outcome": r["rollout"].get("outcome"),
                   "reward": r["rollout"].get("reward"), "failed": r["rollout"].get("failed", 0),
                   "policies": _policy_metrics(r), "policy_kl": r.get("policy_kl", {}),
                   "alarms": r.get("alarms", []),
                   "calls_during_update": r.get("async", {}).get("calls_during_update"),
                   "memory": r.get("memory", {})} for r in steps],
        "staleness": staleness_histogram(steps),
        "evals": [{"step": r["step"], "label": r["eval"], "outcome": r.get("outcome"),
                   **{k: v for k, v in r.items() if k.startswith(("pass@", "maj@"))}} for r in evals],
        "traces": kept,
        "note": (f"Traces: those logged per step (train.log_traces), of {len(keep)} of {len(trace_steps)} steps"
                 f"{' (evenly spread)' if len(keep) < len(trace_steps) else ''}, and the held-out ones of "
                 f"{len(shown)} evaluations (eval.log_traces); texts cut at {max_chars} characters."),
    }


def staleness_histogram(steps: list[dict]) -> dict[str, dict[int, float]]:
    """Per policy: how many of its trained or dropped calls were sampled how many versions before
    the weights they updated (the ``staleness_<age>`` counts of every step, summed)."""
    out: dict[str, dict[int, float]] = {}
    for r in steps:
        for p, m in r.get("policies", {}).items():
            for k, v in m.items():
                if k.startswith("staleness_") and k[len("staleness_"):].isdigit():
                    age = int(k[len("staleness_"):])
                    out.setdefault(p, {})[age] = out.get(p, {}).get(age, 0.0) + v
    return {p: dict(sorted(h.items())) for p, h in out.items()}


def _policy_metrics(rec: dict) -> dict:
    """A step's training metrics per policy, with the rollout's diversity figures beside them."""
    out = {p: dict(m) for p, m in rec.get("policies", {}).items()}
    for p, d in rec.get("rollout", {}).get("policies", {}).items():
        out.setdefault(p, {}).update({k: v for k, v in d.items() if k.startswith("distinct")})
    return out


def build_report(run_dir: str | Path, out: str | Path | None = None, **kw) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MasrlError(f"run directory '{run_dir}' does not exist")
    return write_page(Path(out) if out else run_dir / "report.html", title="masrl report", body=_BODY, style=_STYLE,
                      script=_SCRIPT, data=collect(run_dir, **kw))


_STYLE = """select{margin:0 12px 0 4px}.sample{border:1px solid #ccc;margin:10px 0;padding:8px;border-radius:4px}
.call{border-left:4px solid #89b;margin:8px 0;padding:4px 10px;background:#f7f9fb}
.call h4{margin:2px 0;font-size:13px;cursor:pointer}pre{white-space:pre-wrap;background:#fff;border:1px solid #eee;
padding:6px;margin:4px 0;max-height:320px;overflow:auto}
table.kv td{padding:1px 8px 1px 0;vertical-align:top}"""

_BODY = """<h1>masrl run: <span id="name"></span></h1>
<div class="muted" id="note"></div>
<details><summary>resolved config</summary><pre id="config"></pre></details>
<h2>Collapse alarms</h2><ul id="alarms"></ul>
<h2>Agents</h2><div class="charts" id="agent-charts"></div>
<h2>Policies</h2><div class="charts" id="policy-charts"></div>
<h2>Step time</h2><div class="charts" id="time-charts"></div>
<div id="async-section" style="display:none"><h2>Staleness and off-policy correction</h2>
<div class="muted">Each trained call's age: updates between the weights that sampled it and those it updated
(rollout.mode async); calls older than policies.X.max_staleness are dropped. Importance weights: the
trainer's probability of each token over the engine's.</div>
<table class="kv" id="staleness-table"></table><div class="charts" id="async-charts"></div></div>
<div id="memory-section" style="display:none"><h2>GPU memory</h2>
<div class="muted">Per GPU, GiB: the step's peak allocated and reserved (what the allocator holds from the
device), and what the hosts hold between steps: weights, the engine's KV cache, buffers and weight copies,
the optimizer's fp32 masters and moments.</div><div class="charts" id="memory-charts"></div></div>
<h2>Held-out</h2><div class="charts" id="eval-charts"></div>
<h2>Trace browser</h2>
<div>step or evaluation<select id="step-select"></select>task<select id="task-select"></select></div>
<div id="traces"></div>"""

_SCRIPT = r"""function chart(parent,title,series){
  const W=380,H=180,P=34,box=el('div',{class:'chart'});box.appendChild(el('div',{class:'title'},title));
  const ok=p=>p[1]!==null&&p[1]!==undefined&&isFinite(p[1]), pts=[].concat(...series.map(s=>s.points)).filter(ok);
  const svg=sv('svg',{width:W,height:H,'data-title':title});
  if(pts.length){
    let x0=Math.min(...pts.map(p=>p[0])),x1=Math.max(...pts.map(p=>p[0])),y0=Math.min(...pts.map(p=>p[1])),y1=Math.max(...pts.map(p=>p[1]));
    if(x1===x0)x1=x0+1; if(y1===y0){y1=y0+1;y0=y0-1;}
    const X=x=>P+(x-x0)/(x1-x0)*(W-P-8), Y=y=>H-20-(y-y0)/(y1-y0)*(H-34);
    svg.appendChild(sv('path',{d:`M${P},8V${H-20}H${W-8}`,stroke:'#999',fill:'none'}));
    for(const [v,y] of [[y1,Y(y1)],[y0,Y(y0)]]){const t=sv('text',{x:2,y:y+4,'font-size':10});t.textContent=(+v).toPrecision(3);svg.appendChild(t);}
    const tx=sv('text',{x:W-60,y:H-4,'font-size':10});tx.textContent='step '+x0+'–'+x1;svg.appendChild(tx);
    series.forEach((s,i)=>{const ps=s.points.filter(ok),c=COLORS[i%COLORS.length]; if(!ps.length)return;
      svg.appendChild(sv('polyline',{fill:'none',stroke:c,'stroke-width':1.8,points:ps.map(p=>X(p[0])+','+Y(p[1])).join(' '),'data-series':s.name}));
      for(const p of ps){const dot=sv('circle',{cx:X(p[0]),cy:Y(p[1]),r:2.2,fill:c}),tt=sv('title');
        tt.textContent=s.name+' @ step '+p[0]+': '+(+p[1]).toPrecision(4);dot.appendChild(tt);svg.appendChild(dot);}});
  } else { const t=sv('text',{x:20,y:40});t.textContent='no data';svg.appendChild(t); }
  box.appendChild(svg); legend(box,series); parent.appendChild(box);
}
const steps=D.steps, names=a=>[...new Set([].concat(...steps.map(s=>Object.keys(s[a]||{}))))];
document.getElementById('name').textContent=D.name; document.getElementById('note').textContent=D.note;
document.getElementById('config').textContent=D.config;
const agents=names('agents'), policies=names('policies');
const alarmList=document.getElementById('alarms'), raised=steps.filter(s=>(s.alarms||[]).length);
if(!raised.length) alarmList.appendChild(el('li',{class:'muted'},'none: no agent\'s outputs or entropy collapsed, and groups kept reward variance'));
for(const s of raised) for(const a of s.alarms) alarmList.appendChild(el('li',{class:'err'},'step '+s.step+': '+a));
for(const [key,title] of [['reward','reward'],['accuracy','accuracy'],['format_rate','format rate'],['distinct_2','distinct-2 of completions'],['zero_var_groups','share of groups with equal rewards']])
  chart(document.getElementById('agent-charts'),title+' per agent',agents.map(a=>({name:a,points:steps.map(s=>[s.step,(s.agents[a]||{})[key]])})));
for(const [key,title] of [['loss','loss'],['kl','KL'],['clip_frac','clip fraction'],['entropy','entropy'],['grad_norm','grad norm'],['lp_mismatch','rollout/trainer logprob gap'],['distinct_2','distinct-2 of completions']])
  chart(document.getElementById('policy-charts'),title+' per policy',policies.map(p=>({name:p,points:steps.map(s=>[s.step,(s.policies[p]||{})[key]])})));
const klPairs=names('policy_kl');
if(klPairs.length) chart(document.getElementById('policy-charts'),'KL between policies',klPairs.map(p=>({name:p,points:steps.map(s=>[s.step,(s.policy_kl||{})[p]])})));
chart(document.getElementById('time-charts'),'seconds per step',['rollout_s','update_s','eval_s','checkpoint_s'].map(k=>({name:k.replace('_s',''),points:steps.map(s=>[s.step,s[k]])})));
const hist=D.staleness||{};
if(Object.values(hist).some(h=>Object.keys(h).some(a=>+a>0))||steps.some(s=>s.calls_during_update!==null&&s.calls_during_update!==undefined)){document.getElementById('async-section').style.display='block';
  const tb=document.getElementById('staleness-table'), ages=[...new Set([].concat(...Object.values(hist).map(h=>Object.keys(h).map(Number))))].sort((a,b)=>a-b);
  const head=el('tr');head.appendChild(el('td',{},'policy \\ age'));for(const a of ages)head.appendChild(el('td',{},String(a)));tb.appendChild(head);
  for(const p in hist){const r=el('tr',{'data-policy':p});r.appendChild(el('td',{},p));for(const a of ages)r.appendChild(el('td',{},String(hist[p][a]||0)));tb.appendChild(r);}
  for(const [key,title] of [['staleness_mean','mean staleness'],['stale_dropped','calls dropped as stale'],['ratio','importance ratio (mean)'],['tis_weight','truncated IS weight (mean)'],['mis_masked','share of tokens masked (MIS)']])
    chart(document.getElementById('async-charts'),title+' per policy',policies.map(p=>({name:p,points:steps.map(s=>[s.step,(s.policies[p]||{})[key]])})));
  chart(document.getElementById('async-charts'),'calls sampled during the update',[{name:'calls',points:steps.map(s=>[s.step,s.calls_during_update])}]);}
const gpus=names('memory');
if(gpus.length){document.getElementById('memory-section').style.display='block';
  for(const g of gpus) chart(document.getElementById('memory-charts'),'GiB on '+g,['peak_gib','reserved_gib','weights','engine_kv',
    'engine_weights','engine_buffers','weight_copy','optimizer'].map(k=>({name:k.replace('_gib',''),points:steps.map(s=>[s.step,(s.memory[g]||{})[k]])})));}
const evalKeys=[...new Set([].concat(...D.evals.map(e=>Object.keys(e).filter(k=>k==='outcome'||k.startsWith('pass@')||k.startsWith('maj@')))))];
chart(document.getElementById('eval-charts'),'held-out accuracy',evalKeys.map(k=>({name:k==='outcome'?'accuracy':k,points:D.evals.map(e=>[e.step,e[k]])})));
const stepSel=document.getElementById('step-select'), taskSel=document.getElementById('task-select');
const traceSteps=[...new Set(D.traces.map(t=>t.view))];
for(const s of traceSteps) stepSel.appendChild(el('option',{value:s},s));
function fillTasks(){taskSel.innerHTML='';const st=stepSel.value;
  for(const t of [...new Set(D.traces.filter(x=>x.view===st).map(x=>x.task_id))]) taskSel.appendChild(el('option',{value:t},t)); show();}
function kv(obj){const t=el('table',{class:'kv'});for(const k in obj){const r=el('tr');r.appendChild(el('td',{},k));r.appendChild(el('td',{},typeof obj[k]==='object'?JSON.stringify(obj[k]):String(obj[k])));t.appendChild(r);}return t;}
function show(){const box=document.getElementById('traces');box.innerHTML='';const st=stepSel.value, task=taskSel.value;
  for(const tr of D.traces.filter(x=>x.view===st&&x.task_id===task)){
    const s=el('div',{class:'sample','data-trace':tr.trace_id});
    s.appendChild(el('div',{},'sample '+tr.sample_idx+' · final answer: '+JSON.stringify(tr.final_answer)+' · metrics: '+JSON.stringify(tr.metrics)));
    if(tr.state&&Array.isArray(tr.state.moves))s.appendChild(el('div',{class:'moves'},'moves: '+tr.state.moves.map(m=>'P'+m.seat+' '+m.agent+' '+m.move+(m.invalid?' (invalid)':'')).join(' · ')+(tr.state.reason?' · '+tr.state.reason:'')));
    if(tr.error)s.appendChild(el('div',{class:'err'},'error: '+tr.error));
    for(const c of tr.calls){const d=el('div',{class:'call','data-call':c.call_id});
      const h=el('h4',{},`turn ${c.turn} · ${c.agent} (policy ${c.policy}) · reward ${c.reward===null?'-':(+c.reward).toFixed(3)} · advantage ${c.advantage===null||c.advantage===undefined?'-':(+c.advantage).toFixed(3)}`);
      const body=el('div',{class:'body'});body.style.display='none';h.onclick=()=>{body.style.display=body.style.display==='none'?'block':'none';};
      body.appendChild(el('div',{class:'muted'},'prompt'));body.appendChild(el('pre',{class:'prompt'},(c.messages||[]).map(m=>m.role+': '+m.content).join('\n\n')));
      body.appendChild(el('div',{class:'muted'},'completion ('+c.n_completion_tokens+' tokens, '+c.finish_reason+')'));body.appendChild(el('pre',{class:'completion'},c.completion));
      body.appendChild(el('div',{class:'muted'},'parsed (format ok: '+c.format_ok+', score '+c.format_score+')'));body.appendChild(kv(c.parsed||{}));
      body.appendChild(el('div',{class:'muted'},'reward parts'));const parts=kv(c.reward_parts||{});parts.setAttribute('class','kv reward-parts');body.appendChild(parts);
      const tools=(tr.tool_calls||[]).filter(t=>t.turn===c.turn+1||t.turn===c.turn);
      for(const t of tools){body.appendChild(el('div',{class:'muted'},'tool '+t.name+(t.error?' (error)':'')));body.appendChild(el('pre',{class:'tool'},'args: '+JSON.stringify(t.args)+'\n'+(t.error?'error: '+t.error:'result: '+JSON.stringify(t.result))));}
      d.appendChild(h);d.appendChild(body);s.appendChild(d);}
    box.appendChild(s);}}
stepSel.onchange=fillTasks; taskSel.onchange=show; if(traceSteps.length)fillTasks();
"""
