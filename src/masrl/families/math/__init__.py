"""Math word problems: the seeded arithmetic generator (levels 1-4) and chained problems (2-8 events on one
count); the four-agent team, the checked team with a calculator, debate, the team of steppers, and the single
agents each is measured against (one solver, with the calculator, prompted as the checker, stepping)."""

from __future__ import annotations

from masrl.data.commands import DataCommand, output_file
from masrl.data.sources import Source, SourceSpec
from masrl.families.math import arithmetic, chain
from masrl.families.math.chain_team import MathChainAgent, MathChainTeam
from masrl.families.math.checked import MathChecked
from masrl.families.math.debate import Debate
from masrl.families.math.solver import MathSolver
from masrl.families.math.team import MathTeam


def _arithmetic(s: SourceSpec):
    return arithmetic.generate(s.n or 1000, seed=s.seed, levels=list(s.levels), exclude=set(s.exclude))


def _math_chain(s: SourceSpec):
    return chain.generate(s.n or 1000, seed=s.seed, levels=list(s.levels), exclude=set(s.exclude))


WORKFLOWS = {"math_team": MathTeam, "math_solver": MathSolver, "math_checked": MathChecked,
             "math_chain_team": MathChainTeam, "math_chain_agent": MathChainAgent, "debate": Debate}
SOURCES = {"arithmetic": Source(_arithmetic, levels=(1, 2, 3, 4)),
           "math_chain": Source(_math_chain, levels=chain.LEVELS)}



def _problems_arguments(p) -> None:
    p.add_argument("--out", required=True)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4])


def _write_problems(args) -> int:
    import json

    out = output_file(args.out, "--out")
    tasks = arithmetic.generate(args.n, seed=args.seed, levels=args.levels)
    with open(out, "w") as f:
        for t in tasks:
            f.write(json.dumps({"id": t.id, "question": t.question, "answer": t.answer, "level": t.meta["level"]}) + "\n")
    print(f"[masrl] wrote {len(tasks)} problems to {args.out}")
    return 0


DATA_COMMANDS = {"arithmetic": DataCommand("arithmetic word problems as JSONL", _problems_arguments, _write_problems)}
