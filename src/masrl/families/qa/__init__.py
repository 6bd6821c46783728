"""Questions over a seeded world of people, cities and organisations (``qa_world``): search it (the search team,
one search agent, decompose-retrieve-answer RAG, also as a YAML graph) or read the passages that come with each
question (the reading teams of 8 and 24 passages, two-hop reading, and the single readers)."""

from __future__ import annotations

from masrl.data.commands import DataCommand
from masrl.data.sources import Source, SourceSpec
from masrl.families.qa.rag import RAG
from masrl.families.qa.reading import ReadingAgent, ReadingTeam
from masrl.families.qa.reading_hops import ReadingHops, ReadingHopsAgent
from masrl.families.qa.search import SearchAgent, SearchTeam
from masrl.families.qa.tasks import qa_task
from masrl.families.qa.world import world_tasks


def _qa_world(s: SourceSpec):
    return world_tasks(s.n or 1000, seed=s.seed, world_docs=s.world.docs, world_seed=s.world.seed,
                       levels=list(s.levels), exclude=set(s.exclude), context_docs=s.world.context_docs)


WORKFLOWS = {"search_team": SearchTeam, "search_agent": SearchAgent, "reading_team": ReadingTeam,
             "reading_agent": ReadingAgent, "reading_hops": ReadingHops, "reading_hops_agent": ReadingHopsAgent,
             "rag": RAG}
SOURCES = {"qa_world": Source(_qa_world, levels=(1, 2, 3), more="A larger world (data.world.docs) holds more questions")}
ROW_KINDS = {"qa": qa_task}  # a file's QA rows: a question, its answers, its supporting documents


def _world_corpus(world) -> str:
    """The search tools' default corpus: the seeded world's (``data.world``), written once."""
    from masrl.families.qa.world import ensure_world

    return str(ensure_world(world.docs, world.seed, world.dir) / "corpus.jsonl")


SERVICES = {"corpus": _world_corpus}  # what a run's tools are built on when the config names none


def _world_arguments(p) -> None:
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--docs", type=int, default=1000)
    p.add_argument("--questions", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)


def _write_world(args) -> int:
    import time

    from masrl.families.qa.world_gen import write_world

    t0 = time.time()
    corpus, questions = write_world(args.out, args.docs, args.questions, seed=args.seed)
    print(f"[masrl] wrote {corpus} ({args.docs} documents) and {questions} ({args.questions} questions) "
          f"in {time.time() - t0:.1f}s")
    return 0


DATA_COMMANDS = {"qa-world": DataCommand("a fictional multi-hop QA world: corpus.jsonl + questions.jsonl",
                                         _world_arguments, _write_world)}
