"""CLI commands for tools and data: ``masrl retriever ...`` and ``masrl data ...`` (the task families' own)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from masrl.errors import MasrlError


def existing_file(path: str, what: str) -> Path:
    """``path`` as a Path, or a MasrlError naming the option when there is no such file."""
    p = Path(path)
    if not p.is_file():
        raise MasrlError(f"{what} {path}: no such file" + (" (it is a directory)" if p.is_dir() else ""))
    return p


def _serve(args) -> int:
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer
    from masrl.web import server as web

    existing_file(args.corpus, "--corpus")
    t0 = time.time()
    print(f"[masrl] loading index for {args.corpus} (built on first use)...", flush=True)
    index = BM25Index.load(args.corpus)
    server = RetrieverServer(index, args.host, args.port, idle_timeout_s=args.idle_timeout,
                             max_connections=args.max_connections, api_key=_key(args.api_key_env))
    print(f"[masrl] {len(index)} documents indexed in {time.time() - t0:.1f}s; serving on {server.url} "
          f"(POST /retrieve, GET /health); Ctrl-C to stop", flush=True)
    if not web.loopback_host(args.host):
        print(f"[masrl] warning: listening on {args.host}, reachable from other machines"
              + ("" if args.api_key_env else " (without --api-key-env it answers loopback hosts only)"), file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("\n[masrl] stopped", file=sys.stderr)
    finally:
        server.sock.close()
    return 0


def _key(api_key_env: str | None) -> str | None:
    import os

    if not api_key_env:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise MasrlError(f"--api-key-env {api_key_env}: ${api_key_env} is not set")
    return key


def _index(args) -> int:
    from masrl.tools.retrieval.index import BM25Index

    existing_file(args.corpus, "--corpus")
    t0 = time.time()
    index = BM25Index.build(args.corpus)
    print(f"[masrl] indexed {len(index)} documents in {time.time() - t0:.1f}s -> {BM25Index.index_dir(args.corpus)}")
    return 0


def _query(args) -> int:
    from masrl.tools.retrieval import LocalRetriever, RetrieverClient

    if not args.endpoint and not args.corpus:
        raise MasrlError("retriever query: give --endpoint URL (a running server) or --corpus FILE (a local index)")
    if not args.endpoint:
        existing_file(args.corpus, "--corpus")
    retriever = (RetrieverClient(args.endpoint, api_key=_key(args.api_key_env)) if args.endpoint
                 else LocalRetriever(args.corpus))
    result = retriever.retrieve(args.queries, args.topk, True)
    print(json.dumps({"result": result}, indent=2))
    return 0


def _export(args) -> int:
    from masrl.data.commands import output_file
    from masrl.driver.serving.verl_data import export_rows
    from masrl.families import config_path

    out = output_file(args.out, "--out")
    if out.suffix not in (".parquet", ".jsonl"):
        raise MasrlError(f"--out {args.out}: name a .parquet (verl's format) or .jsonl file")
    rows = export_rows(str(config_path(args.config)), args.overrides, args.split, args.n)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"[masrl] wrote {len(rows)} {args.split} tasks of {args.config} to {out} (verl: "
          f"custom_reward_function.path=<masrl>/src/masrl/driver/serving/verl_data.py, .name=compute_score)")
    return 0


def add_commands(sub) -> None:
    from masrl.web.server import bounded

    r = sub.add_parser("retriever", help="BM25 retrieval service").add_subparsers(dest="retriever_cmd", required=True)
    s = r.add_parser("serve", help="serve POST /retrieve over a JSONL corpus")
    s.add_argument("--corpus", required=True, help="JSONL of {id, title?, text}; index saved beside it")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--idle-timeout", type=bounded(float, 0.01, 3600), default=30.0,
                   help="seconds before an idle or half-sent connection is closed (0.01-3600)")
    s.add_argument("--max-connections", type=bounded(int, 1, 100_000), default=1024,
                   help="open connections past this get a 503 (1-100000)")
    s.add_argument("--api-key-env", help="environment variable holding the key every request must send; without one "
                                         "only requests to a loopback host are answered")
    s.set_defaults(fn=_serve)
    i = r.add_parser("index", help="(re)build the index beside the corpus")
    i.add_argument("--corpus", required=True)
    i.set_defaults(fn=_index)
    q = r.add_parser("query", help="query a server (--endpoint) or the local index (--corpus)")
    q.add_argument("queries", nargs="+")
    q.add_argument("--endpoint", action="append", help="server URL; repeat for failover")
    q.add_argument("--corpus")
    q.add_argument("--topk", type=int, default=3)
    q.add_argument("--api-key-env", help="environment variable holding the server's API key")
    q.set_defaults(fn=_query)

    from masrl.families import DATA_COMMANDS

    d = sub.add_parser("data", help="generate task data").add_subparsers(dest="data_cmd", required=True)
    x = d.add_parser("export", help="a config's tasks in verl's parquet layout, each prompt the messages masrl sends "
                                    "(verl's reward function: masrl.driver.serving.verl_data:compute_score)")
    x.add_argument("config", help="a run config (single-call workflows without tools)")
    x.add_argument("overrides", nargs="*", help="key=value overrides, as for masrl train")
    x.add_argument("--split", choices=["train", "eval"], default="train")
    x.add_argument("--out", required=True, help="FILE.parquet (verl reads it) or FILE.jsonl")
    x.add_argument("--n", type=bounded(int, 1, 10_000_000), default=None, help="the first N tasks (default: all)")
    x.set_defaults(fn=_export)
    for name, cmd in DATA_COMMANDS.items():  # each task family's (its DATA_COMMANDS)
        p = d.add_parser(name, help=cmd.help)
        cmd.arguments(p)
        p.set_defaults(fn=cmd.run)
