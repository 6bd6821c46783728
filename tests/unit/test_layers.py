"""The house's floors, read from the source: every import (module level, inside functions, or
for type checking only) goes to the same floor or one below, nothing imports in a circle, and no
folder is a crowded room. docs/design.md draws the same floors."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "masrl"

# top floor first; a package (or loose module) of masrl on each
FLOORS = [
    ("cli",),
    ("driver",),
    ("families",),
    ("workflows", "envs", "rewards"),
    ("worker",),
    ("engines",),
    ("modeling",),
    ("tools",),
    ("models", "sandbox"),
    ("data",),
    ("algorithms",),
    ("agents", "policies", "messages", "trace", "parsing", "seeding", "web"),
    ("config",),
    ("errors",),
]
FLOOR = {name: i for i, names in enumerate(FLOORS) for name in names}


def _module(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """masrl module -> the masrl modules it imports (anywhere in its source)."""
    modules = {_module(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                # ``from pkg import x``: the module pkg.x when x is one, else pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    graph[name].add(t)
    for name in modules:
        graph.setdefault(name, set())
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of nodes that reach each other (strongly connected, more than one node)."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for w in graph.get(todo.pop(), ()):
                if w not in seen:
                    seen.add(w)
                    todo.append(w)
        return seen

    reached = {v: reach(v) for v in graph}
    groups = {frozenset({v} | {w for w in reached[v] if v in reached.get(w, ())}) for v in graph}
    return sorted(sorted(g) for g in groups if len(g) > 1)


def _floor_name(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "masrl"


def test_no_module_imports_in_a_circle():
    assert cycles(import_graph()) == []


def test_no_package_imports_in_a_circle():
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in import_graph().items():
        for b in targets:
            if _floor_name(a) != _floor_name(b):
                packages[_floor_name(a)].add(_floor_name(b))
    assert cycles(packages) == []


def test_every_import_goes_down_or_stays_on_its_floor():
    graph = import_graph()
    unplaced = sorted({_floor_name(m) for m in graph} - set(FLOOR) - {"masrl"})
    assert not unplaced, f"place these on a floor in FLOORS (and in docs/design.md): {unplaced}"
    climbs = [f"{a} -> {b}" for a, targets in graph.items() for b in targets
              if _floor_name(a) != "masrl" and FLOOR[_floor_name(b)] < FLOOR[_floor_name(a)]]
    assert climbs == []


def test_the_check_sees_a_climb_and_a_circle():
    """The checks above can fail: a made-up graph with a circle and an import up a floor."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    graph = import_graph()
    graph["masrl.errors"].add("masrl.driver.builder")
    assert any(a == "masrl.errors" for a, ts in graph.items() for b in ts if FLOOR[_floor_name(b)] < FLOOR["errors"])


def family_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of one family's modules (``masrl.families.<name>...``) from outside the families: the framework reaches
    families only through the registries ``masrl.families`` builds."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() if not a.startswith("masrl.families")
                  for b in targets if b.startswith("masrl.families."))


def test_no_framework_module_imports_a_family():
    assert family_imports(import_graph()) == []
    graph = import_graph()  # the check can fail: a made-up import of the QA world from the driver's services
    graph["masrl.driver.rollout.services"].add("masrl.families.qa.world")
    assert family_imports(graph) == ["masrl.driver.rollout.services -> masrl.families.qa.world"]


def test_rooms_stay_small():
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert len(loose) <= 10, loose
    for top in ("driver", "engines", "worker"):
        for folder in [PKG / top, *(p for p in (PKG / top).rglob("*") if p.is_dir() and p.name != "__pycache__")]:
            files = sorted(p.name for p in folder.glob("*.py"))
            assert len(files) <= 8, (folder, files)


# names by which a module function would take one of the house's working objects as its first parameter
HOLDER_NAMES = {"worker", "w", "host", "held", "trainer", "t", "tr", "controller", "rt", "runtime", "sampler",
                "updater", "learner"}


def exiled_functions(sources: dict[str, str]) -> list[str]:
    """Module functions of worker/ and driver/ whose first parameter is an object of those rooms (by its
    annotation, or by a name such objects go by): methods moved out of their class."""
    classes = {n.name for src in sources.values() for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef)
               and not any("dataclass" in ast.unparse(d) for d in n.decorator_list)}  # records (Sample) are data
    found = []
    for name, src in sources.items():
        for node in ast.parse(src).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.args.args:
                first = node.args.args[0]
                ann = ast.unparse(first.annotation).strip("'\"").split(".")[-1] if first.annotation else ""
                if first.arg in HOLDER_NAMES or ann in classes:
                    found.append(f"{name}: {node.name}({first.arg})")
    return found


def test_no_module_function_takes_a_working_object_first():
    sources = {str(p.relative_to(PKG)): p.read_text() for top in ("worker", "driver") for p in (PKG / top).rglob("*.py")}
    assert exiled_functions(sources) == []


def test_the_exile_check_sees_one():
    made_up = {"a.py": "class Sampler:\n    pass\n\ndef fill(s: Sampler, n: int):\n    pass\n\ndef go(trainer):\n    pass\n",
               "b.py": "def fine(cfg, trainer):\n    pass\n"}
    assert exiled_functions(made_up) == ["a.py: fill(s)", "a.py: go(trainer)"]
