"""Search-R1's retrieval protocol, both directions, and the server under idle, half-sent and many
connections. The Search-R1 side is a stand-in written to the shapes its source uses: its agent
posts {"queries", "topk", "return_scores": true} and reads doc["document"]["contents"], taking the
title from the first line; its server answers scored entries {"document": {...}, "score"} or, without
scores, the documents themselves."""

import json
import socket
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from masrl.families.qa.world_gen import write_world
from masrl.tools.retrieval import BM25Index, LocalRetriever, RetrieverClient
from masrl.tools.retrieval.server import RetrieverServer, wait_healthy


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    corpus, questions = write_world(tmp_path_factory.mktemp("world"), 300, 100, seed=3)
    return corpus, [json.loads(x)["question"] for x in questions.read_text().splitlines()]


@pytest.fixture(scope="module")
def index(world):
    return BM25Index.load(world[0])


def search_r1_agent_search(url: str, queries: list[str], topk: int = 3) -> list[str]:
    """What Search-R1's generation loop does with a retriever: post, then format passages."""
    payload = json.dumps({"queries": queries, "topk": topk, "return_scores": True}).encode()
    req = urllib.request.Request(url + "/retrieve", data=payload, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        results = json.loads(r.read())["result"]
    out = []
    for docs in results:
        ref = ""
        for i, doc in enumerate(docs):
            content = doc["document"]["contents"]
            title, text = content.split("\n")[0], "\n".join(content.split("\n")[1:])
            ref += f"Doc {i + 1}(Title: {title}) {text}\n"
        out.append(ref)
    return out


def test_search_r1_agent_reads_our_server(index, world):
    server = RetrieverServer(index).start()
    try:
        assert wait_healthy(server.url, 10)
        refs = search_r1_agent_search(server.url, world[1][:3])
        local = LocalRetriever(world[0]).retrieve(world[1][:3], 3)
        for ref, docs in zip(refs, local):
            titles = [d["contents"].split("\n")[0] for d in docs]
            assert ref.count("Doc ") == 3 and all(f"(Title: {t})" in ref for t in titles)
    finally:
        server.stop()


class SearchR1StandIn(BaseHTTPRequestHandler):
    """Answers like Search-R1's retrieval server."""

    def log_message(self, *a):
        pass

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        docs = [{"id": f"d{i}", "contents": f"Title {i}\nText about {q}"} for q in req["queries"]
                for i in range(req.get("topk", 3))]
        k = req.get("topk", 3)
        per_query = [docs[j * k : (j + 1) * k] for j in range(len(req["queries"]))]
        if req.get("return_scores"):
            result = [[{"document": d, "score": 10.0 - i} for i, d in enumerate(ds)] for ds in per_query]
        else:
            result = per_query
        body = json.dumps({"result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_our_client_reads_a_search_r1_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SearchR1StandIn)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = RetrieverClient(f"http://127.0.0.1:{httpd.server_address[1]}")
        scored = client.retrieve(["who", "what"], 2, True)
        assert scored[1] == [{"id": "d0", "contents": "Title 0\nText about what", "score": 10.0},
                             {"id": "d1", "contents": "Title 1\nText about what", "score": 9.0}]
        plain = client.retrieve(["who"], 2, False)
        assert plain == [[{"id": "d0", "contents": "Title 0\nText about who"},
                          {"id": "d1", "contents": "Title 1\nText about who"}]]
    finally:
        httpd.shutdown()
        httpd.server_close()


def _closed_within(sock: socket.socket, seconds: float, answer: bytes = b"") -> bool:
    """Whether the server closes ``sock`` within ``seconds``, having sent ``answer`` first (a prefix)."""
    sock.settimeout(seconds)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except socket.timeout:
        return False
    return got.startswith(answer)


def test_idle_and_half_sent_connections_are_closed_and_connections_are_capped(index):
    server = RetrieverServer(index, idle_timeout_s=0.5, max_connections=3).start()
    try:
        assert wait_healthy(server.url, 10)
        host, port = "127.0.0.1", int(server.url.rsplit(":", 1)[1])
        idle = socket.create_connection((host, port))
        half = socket.create_connection((host, port))
        half.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"queries\"")
        assert _closed_within(idle, 5) and _closed_within(half, 5, b"HTTP/1.1 408")  # a late body gets its 408
        held = [socket.create_connection((host, port)) for _ in range(3)]
        time.sleep(0.2)
        extra = socket.create_connection((host, port))
        extra.settimeout(5)
        reply = extra.recv(4096).decode()
        assert reply.startswith("HTTP/1.1 503") and "too many open connections" in reply
        for s in held + [idle, half, extra]:
            s.close()
        time.sleep(1.0)  # the held ones time out; the server takes new connections again
        assert wait_healthy(server.url, 5)
    finally:
        server.stop()


def test_concurrent_requests_are_batched_into_fewer_index_lookups(index, world):
    server = RetrieverServer(index).start()
    try:
        assert wait_healthy(server.url, 10)
        questions = world[1][:40]
        expected = LocalRetriever(world[0]).retrieve(questions, 3)
        got: dict[int, list] = {}

        def ask(i):
            got[i] = RetrieverClient(server.url).retrieve([questions[i]], 3)[0]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(questions))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [[d["id"] for d in got[i]] for i in range(len(questions))] == [[d["id"] for d in r] for r in expected]
        assert server.batcher.batches < len(questions)  # some lookups served several requests at once
    finally:
        server.stop()
