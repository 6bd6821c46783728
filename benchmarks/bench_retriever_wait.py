"""How long a normal retriever query waits beside the largest legal requests (head-of-line), on this machine.

Run: python benchmarks/bench_retriever_wait.py [--docs 2000] [--heavy 10] [--repeats 3]

A BM25 server on 127.0.0.1 over ``--docs`` documents of 60 random words; ``--heavy`` requests at once, each the
largest the server takes (256 queries of 2,000 characters, topk 100), and one normal query (one short query,
topk 3) sent 50 ms after them. Every query of a server goes through one batching thread (``QueryBatcher``), so
the normal query waits behind what is queued; the table gives its latency alone and beside the heavy requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import aiohttp


async def _post(session, url, body):
    t0 = time.perf_counter()
    async with session.post(url, data=json.dumps(body), headers={"Content-Type": "application/json"}) as r:
        await r.read()
        return r.status, time.perf_counter() - t0


async def one_round(url: str, heavy: int, rng: random.Random) -> tuple[float, float]:
    words = [f"w{i}" for i in range(5000)]
    big = {"queries": [" ".join(rng.choice(words) for _ in range(330))[:2000] for _ in range(256)], "topk": 100}
    normal = {"queries": ["w1 w2 w3"], "topk": 3}
    async with aiohttp.ClientSession() as s:
        _, alone = await _post(s, url, normal)
        loads = [asyncio.ensure_future(_post(s, url, big)) for _ in range(heavy)]
        await asyncio.sleep(0.05)
        status, beside = await _post(s, url, normal)
        done = await asyncio.gather(*loads)
    assert status == 200 and all(st == 200 for st, _ in done)
    return alone, beside


def main() -> None:
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--heavy", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as d:
        corpus = Path(d) / "c.jsonl"
        corpus.write_text("".join(json.dumps({"id": str(i), "text": " ".join(f"w{rng.randrange(5000)}"
                                                                             for _ in range(60))}) + "\n"
                                  for i in range(a.docs)))
        server = RetrieverServer(BM25Index.load(corpus)).start()
        try:
            rows = [asyncio.run(one_round(f"{server.url}/retrieve", a.heavy, rng)) for _ in range(a.repeats)]
        finally:
            server.stop()
    print(f"\n`python benchmarks/bench_retriever_wait.py --docs {a.docs} --heavy {a.heavy} --repeats {a.repeats}` on "
          f"{platform.node()} ({os.cpu_count()} cores)\n")
    print("| round | normal query alone, s | beside the heavy requests, s |")
    print("| --- | --- | --- |")
    for i, (alone, beside) in enumerate(rows, 1):
        print(f"| {i} | {alone:.3f} | {beside:.3f} |")
    print(f"\nworst wait beside them: {max(b for _, b in rows):.2f} s")


if __name__ == "__main__":
    main()
