"""One static HTML page with its data embedded: what ``masrl report`` and ``masrl compare`` write.

A page is its title, its body, and a script that draws ``D`` (the embedded data) with inline SVG;
the style, the data block and the drawing helpers every page shares (``COLORS``, ``el`` for HTML
elements, ``sv`` for SVG ones) are written here once. No library and no network: the file opens
anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

STYLE = """body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;max-width:1300px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:14px}.chart{border:1px solid #ddd;padding:6px;background:#fff}
.chart .title{font-weight:600;font-size:13px}.legend span{margin-right:10px;font-size:12px}
table{border-collapse:collapse}.muted{color:#777;font-size:12px}.err{color:#b00}"""

HELPERS = r"""const D=JSON.parse(document.getElementById('data').textContent), NS='http://www.w3.org/2000/svg';
const COLORS=['#1f77b4','#d62728','#2ca02c','#ff7f0e','#9467bd','#8c564b','#e377c2','#17becf'];
function el(tag,attrs,text){const e=document.createElement(tag);for(const k in (attrs||{}))e.setAttribute(k,attrs[k]);
  if(text!==undefined)e.textContent=text;return e;}
function sv(tag,attrs){const e=document.createElementNS(NS,tag);for(const k in (attrs||{}))e.setAttribute(k,attrs[k]);return e;}
function legend(box,series){const lg=el('div',{class:'legend'});
  series.forEach((s,i)=>{const sp=el('span',{},'— '+s.name);sp.style.color=COLORS[i%COLORS.length];lg.appendChild(sp);});
  box.appendChild(lg);}"""


def render(*, title: str, body: str, script: str, data: dict, style: str = "") -> str:
    """The page: shared style and helpers, the page's own, and ``data`` as JSON (``</`` escaped,
    so no string in it can close the script element)."""
    blob = json.dumps(data, default=str).replace("</", "<\\/")
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>\n'
            f"<style>\n{STYLE}\n{style}\n</style></head><body>\n{body}\n"
            f'<script id="data" type="application/json">{blob}</script>\n'
            f"<script>\n{HELPERS}\n{script}\n</script></body></html>\n")


def write_page(path: str | Path, **page) -> Path:
    """``render(**page)`` written to ``path`` (its folder made)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(**page), encoding="utf-8")
    return path
