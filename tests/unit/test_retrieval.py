"""The real retrieval server on loopback, bad requests, client failover, the local retriever."""

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from masrl.errors import DataError
from masrl.families.qa.world_gen import write_world
from masrl.tools.retrieval import BM25Index, LocalRetriever, RetrievalError, RetrieverClient
from masrl.tools.retrieval.client import RequestRejected
from masrl.tools.retrieval.server import RetrieverServer, wait_healthy


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("world")
    corpus, questions = write_world(d, 400, 200, seed=7)
    qs = [json.loads(x) for x in questions.read_text().splitlines()]
    return corpus, qs


@pytest.fixture(scope="module")
def index(world):
    return BM25Index.load(world[0])


@pytest.fixture
def server(index):
    s = RetrieverServer(index).start()
    assert wait_healthy(s.url, 10)
    yield s
    s.stop()


def post(url, body: bytes, headers=None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/retrieve", body=body, headers=headers or {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data) if data else None


def test_index_is_saved_beside_the_corpus_and_reused(world, index):
    corpus, _ = world
    d = BM25Index.index_dir(corpus)
    assert (d / "masrl.json").is_file()
    t0 = time.time()
    again = BM25Index.load(corpus)
    assert len(again) == len(index) == 400 and time.time() - t0 < 10


def test_server_binds_loopback_and_answers(server, world):
    assert server.url.startswith("http://127.0.0.1:")
    _, qs = world
    status, body = post(server.url, json.dumps({"queries": [qs[0]["question"], "mayor"], "topk": 4,
                                                "return_scores": True}).encode())
    assert status == 200
    assert len(body["result"]) == 2 and all(len(r) == 4 for r in body["result"])
    first = body["result"][0]  # Search-R1's scored shape
    assert set(first[0]) == {"document", "score"} and {"id", "contents"} <= set(first[0]["document"])
    assert [d["score"] for d in first] == sorted([d["score"] for d in first], reverse=True)
    status, body = post(server.url, json.dumps({"queries": ["x"], "topk": 2}).encode())
    assert status == 200 and set(body["result"][0][0]) == {"id", "contents"}  # plain: the documents themselves


@pytest.mark.parametrize("body,status,needle", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (json.dumps({"queries": []}).encode(), 400, "empty"),
    (json.dumps({"queries": "one"}).encode(), 400, "list of strings"),
    (json.dumps({"queries": ["q"] * 1000}).encode(), 413, "at most"),
    (json.dumps({"queries": ["q"], "topk": 0}).encode(), 400, "topk"),
    (json.dumps({"queries": ["q"], "topk": 101}).encode(), 400, "topk"),
    (json.dumps({"queries": ["q"], "topk": "3"}).encode(), 400, "topk"),
    (json.dumps({"queries": ["q"], "topk": 3, "extra": 1}).encode(), 400, "unknown field"),
    (json.dumps({"queries": ["q" * 5000]}).encode(), 413, "longer than"),
])
def test_bad_requests_get_4xx_with_a_message(server, body, status, needle):
    got, payload = post(server.url, body)
    assert got == status and needle in payload["error"]


def test_oversized_body_and_unknown_routes(server):
    host, port = server.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 99999999\r\n\r\n")
    chunks = []
    while True:  # the server answers and closes; read to the end
        chunk = s.recv(4096)
        if not chunk:
            break
        chunks.append(chunk)
    reply = b"".join(chunks).decode()
    s.close()
    assert reply.startswith("HTTP/1.1 413") and "limit" in reply
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/nope")
    r = conn.getresponse()
    assert r.status == 404 and "GET /health" in json.loads(r.read())["error"]
    conn.request("GET", "/health")
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["documents"] == 400


def test_client_and_local_retriever_agree(server, world, index):
    _, qs = world
    questions = [q["question"] for q in qs[:5]]
    remote = RetrieverClient([server.url]).retrieve(questions, 3)
    local = LocalRetriever(world[0]).retrieve(questions, 3)
    assert [[d["id"] for d in r] for r in remote] == [[d["id"] for d in r] for r in local]


def test_client_fails_over_when_a_server_dies_and_retries_it_later(index):
    a = RetrieverServer(index).start()
    b = RetrieverServer(index).start()
    port_a = int(a.url.rsplit(":", 1)[1])
    client = RetrieverClient([a.url, b.url], timeout_s=2, retries=1, backoff_s=0.01, dead_for_s=0.5)
    assert client.retrieve(["mayor"], 2)
    a.stop()  # killed mid-test
    assert client.retrieve(["mayor"], 2)  # served by b
    assert client._order()[0] == b.url  # a is parked as dead
    # bring a back on the same port, kill b: after dead_for_s, a is tried again and serves
    a2 = RetrieverServer(index, port=port_a).start()
    b.stop()
    time.sleep(0.6)
    assert client.retrieve(["mayor"], 2)
    a2.stop()
    with pytest.raises(RetrievalError) as e:
        client.retrieve(["mayor"], 2)
    assert a.url in str(e.value) and b.url in str(e.value)


class _Bad(BaseHTTPRequestHandler):
    mode = "garbage"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "slow":
            time.sleep(3)
        data = b"<html>not json</html>" if self.mode == "garbage" else json.dumps({"result": "wrong"}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def bad_server(mode):
    handler = type(f"Bad{mode}", (_Bad,), {"mode": mode})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.mark.parametrize("mode", ["garbage", "wrong-shape", "slow"])
def test_garbage_or_slow_server_makes_the_client_fail_over(server, mode):
    httpd, url = bad_server(mode)
    try:
        client = RetrieverClient([url, server.url], timeout_s=1, retries=0)
        assert len(client.retrieve(["mayor"], 2)[0]) == 2
        lonely = RetrieverClient([url], timeout_s=1, retries=1, backoff_s=0.01)
        with pytest.raises(RetrievalError, match="all 1 retriever endpoint"):
            lonely.retrieve(["mayor"], 2)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_bad_request_is_not_retried_elsewhere(server):
    with pytest.raises(RequestRejected, match="topk"):
        RetrieverClient([server.url]).retrieve(["q"], 0)


def test_corpus_errors_name_the_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": 1, "text": "a"}\n{"text": "no id"}\n')
    with pytest.raises(DataError, match=r"c.jsonl:2: missing field 'id'"):
        BM25Index.build(p)
    p.write_text('{"id": 1, "text": "a"}\n{"id": 1, "text": "b"}\n')
    with pytest.raises(DataError, match="duplicate id"):
        BM25Index.build(p)


def test_stale_index_is_rebuilt(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"id": "a", "text": "apples and pears"}\n{"id": "b", "text": "boats"}\n')
    assert LocalRetriever(p).retrieve(["boats"], 1)[0][0]["id"] == "b"
    time.sleep(0.01)
    p.write_text('{"id": "a", "text": "apples"}\n{"id": "c", "text": "cranes and boats"}\n')
    assert LocalRetriever(p).retrieve(["boats"], 1)[0][0]["id"] == "c"


_BUILD = """
import sys, time
from masrl.tools.retrieval.index import BM25Index
start = float(sys.argv[2])
while time.time() < start:
    time.sleep(0.001)
idx = BM25Index.load(sys.argv[1])
hits = idx.search(["boats"], topk=1)[0]
print(idx.ids[hits[0][0]])
"""


def test_processes_building_one_index_at_once_all_succeed(tmp_path):
    """Runs side by side share the index cache; on the H200 one of eight runs building the same index
    at once died on a file another had deleted. Six real processes start the build at one instant."""
    p = tmp_path / "c.jsonl"
    rows = [{"id": f"d{i}", "text": f"document {i} about " + ("boats" if i == 7 else "apples")} for i in range(300)]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    start = time.time() + 6.0
    procs = [subprocess.Popen([sys.executable, "-c", _BUILD, str(p), str(start)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(6)]
    outs = [pr.communicate(timeout=120) for pr in procs]
    assert [pr.returncode for pr in procs] == [0] * 6, [e[-600:] for _, e in outs]
    assert [o.strip() for o, _ in outs] == ["d7"] * 6
    assert BM25Index.is_current(p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["c.jsonl", "c.jsonl.bm25"]  # no temporary folder left
