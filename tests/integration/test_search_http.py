"""The search team trains against real retrieval servers on 127.0.0.1: a dead first endpoint fails
over to a live one; with every endpoint down the traces are dropped as infrastructure failures."""

import json
import socket

import pytest
from tinycfg import tiny_config

from masrl.config import load_config
from masrl.driver.run.loop import train
from masrl.errors import MasrlError
from masrl.families.qa.world import ensure_world
from masrl.tools.retrieval import BM25Index
from masrl.tools.retrieval.server import RetrieverServer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_search_team_fails_over_to_a_live_server(tmp_path):
    world = ensure_world(40, 0, str(tmp_path / "w"))
    server = RetrieverServer(BM25Index.load(world / "corpus.jsonl")).start()
    dead = f"http://127.0.0.1:{_free_port()}"
    try:
        data = tiny_config("qa/search_team_shared", tmp_path / "run", steps=1)
        data["data"]["world"]["dir"] = str(tmp_path / "w")
        data["retriever"] = {"kind": "http", "endpoints": [dead, server.url], "timeout_s": 2, "retries": 0}
        train(load_config(data=data))
        rec = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][0]
        assert rec["rollout"]["failed"] == 0
        traces = [json.loads(x) for x in (tmp_path / "run" / "traces.jsonl").read_text().splitlines()]
        results = [t for tr in traces for t in tr["tool_calls"] if t["name"] == "search"]
        assert results and all(t["result"] and not t["infra"] for t in results)
    finally:
        server.stop()
    data = tiny_config("qa/search_team_shared", tmp_path / "run2", steps=1)
    data["data"]["world"]["dir"] = str(tmp_path / "w")
    data["retriever"] = {"kind": "http", "endpoints": [dead, server.url], "timeout_s": 1, "retries": 0}
    with pytest.raises(MasrlError, match="(?s)6 of 6 traces failed.*all 2 retriever endpoint"):
        train(load_config(data=data))
