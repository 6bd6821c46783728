"""README.md and docs/ as a reader arriving today meets them: every relative link and anchor resolves, and
every shipped config is in usage.md's table."""

from __future__ import annotations

import re
from pathlib import Path

from masrl.families import shipped_configs

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces to
    hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path):
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, mailto: ...
            continue
        yield target


def test_the_slug_is_githubs():
    assert slug("Does a trained team beat one agent?") == "does-a-trained-team-beat-one-agent"
    assert slug("`make demo`'s two arms side by side (`--side-by-side`, 2026-12-03)") == \
        "make-demos-two-arms-side-by-side---side-by-side-2026-12-03"
    assert slug("Against vLLM (`benchmarks/bench_vllm.py`)") == "against-vllm-benchmarksbench_vllmpy"


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_shipped_config_is_in_the_usage_table():
    table = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    missing = [name for name in shipped_configs() if f"`{name}`" not in table]
    assert missing == []
