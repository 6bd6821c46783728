"""Every input path costs at most what its size allows (issue 60, items 1-9): `masrl serve` as it ships (a real
subprocess on 127.0.0.1, the LoRA math team on tiny-random) and the retriever, each bad request sent beside
good ones; the good ones are answered, the bad one gets a 4xx in the server's JSON error shape, and the log
gets one line, not a traceback."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from tinycfg import start_serve

from masrl.families import config_path

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = config_path("math/team_lora")
AGENTS = ["solver", "verifier", "refiner", "finalizer"]


class Served:
    def __init__(self):
        self.proc, self.url, seen = start_serve(CONFIG, "model=tiny-random", "--read-timeout-s", "2", timeout_s=180)
        self.port = int(self.url.rsplit(":", 1)[1])
        self.lines = seen  # the server's log, read on start_serve's thread so that it never blocks on a full pipe

    def log_since(self, n: int) -> str:
        time.sleep(0.3)
        return "".join(self.lines[n:])


@pytest.fixture(scope="module")
def served():
    s = Served()
    yield s
    s.proc.terminate()
    try:
        s.proc.wait(20)
    except subprocess.TimeoutExpired:
        s.proc.kill()


def _ask(agent="verifier", content="What is 2 + 2?", **extra) -> dict:
    return {"model": agent, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **extra}


async def _post(session, url, body, headers=None):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **(headers or {})}) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text), r.headers
        except ValueError:
            return r.status, {"raw": text}, r.headers


def _beside_good_ones(url: str, bad: list, headers: dict | None = None):
    """Each bad body beside eight good requests across the four adapters, all at once."""

    async def go():
        async with aiohttp.ClientSession() as s:
            good = [_post(s, f"{url}/v1/chat/completions", _ask(AGENTS[i % 4], f"What is {i} + 1?")) for i in range(8)]
            bads = [_post(s, f"{url}/v1/chat/completions", b, headers) for b in bad]
            out = await asyncio.gather(*good, *bads)
            return out[:8], out[8:]

    good, bads = asyncio.run(go())
    assert [status for status, _, _ in good] == [200] * 8, good
    return bads


def _raw(port: int, payload: bytes, wait: float = 10.0) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(payload)
    sock.settimeout(wait)
    out = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            out += chunk
    except socket.timeout:
        out += b"<no answer>"
    finally:
        sock.close()
    return out


def _json_answer(reply: bytes) -> tuple[int, dict, bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head and b"aiohttp" not in head, head
    return status, json.loads(body), head


def test_tool_call_arguments_nested_deep_or_with_a_huge_integer_get_a_400_naming_the_field(served):
    deep = "[" * 100_000 + "]" * 100_000
    digits = '{"x": ' + "9" * 5000 + "}"
    shallow_but_past_the_cap = "[" * 40 + "]" * 40
    bad = [{"model": "solver", "messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]}]}
        for args in (deep, digits, shallow_but_past_the_cap)]
    answers = _beside_good_ones(served.url, bad)
    for (status, body, _), says in zip(answers, ("nested too deeply", "too many digits", "more than 32 deep")):
        assert status == 400 and body["error"]["param"] == "messages[1].tool_calls[0].function.arguments", body
        assert says in body["error"]["message"], body


def test_a_gzip_body_that_does_not_decode_gets_a_400_on_the_gateway(served):
    bad = b"this is not gzip at all: " + json.dumps(_ask()).encode()
    status, body, _ = _json_answer(_raw(served.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                      b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
                                                      b"Content-Length: %d\r\n\r\n" % len(bad) + bad))
    assert status == 400 and "could not be read" in body["error"]["message"], body
    _beside_good_ones(served.url, [])  # and the server still answers


def test_a_body_that_arrives_after_the_read_timeout_gets_its_408(served):
    t0 = time.perf_counter()
    reply = _raw(served.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                              b"application/json\r\nContent-Length: 500\r\n\r\n{\"model\": ", wait=20)
    status, body, _ = _json_answer(reply)
    assert status == 408 and "did not arrive within 2 s" in body["error"]["message"], body
    assert time.perf_counter() - t0 < 15


def test_400_000_empty_messages_are_refused_before_any_per_message_work_and_stall_no_one(served):
    flood = {"model": "solver", "messages": [{"role": "user", "content": ""}] * 400_000, "max_tokens": 4}

    async def go():
        async with aiohttp.ClientSession() as s:
            first = asyncio.ensure_future(_post(s, f"{served.url}/v1/chat/completions", flood))
            await asyncio.sleep(0.5)
            t0 = time.perf_counter()
            normal = await _post(s, f"{served.url}/v1/chat/completions", _ask())
            return await first, normal, time.perf_counter() - t0

    (status, body, _), (ok, _, _), waited = asyncio.run(go())
    assert ok == 200 and waited < 2.0, waited  # before: every other request waited 14.6 s
    assert status == 400 and body["error"]["param"] == "messages" and "at most 2048" in body["error"]["message"]


@pytest.mark.parametrize("field, value, param", [
    ("tools", [{"type": "function", "function": {"name": f"f{i}"}} for i in range(500)], "tools"),
    ("messages", [{"role": "user", "content": [{"type": "text", "text": "x"}] * 1000}], "messages[0].content"),
    ("messages", [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}] * 1000}], "messages[0].tool_calls"),
])
def test_parts_tool_calls_and_tools_are_counted_before_they_are_read(served, field, value, param):
    (status, body, _), = _beside_good_ones(served.url, [{**_ask(), field: value}])
    assert status == 400 and body["error"]["param"] == param and "at most" in body["error"]["message"], body


def _compact(body: dict) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


@pytest.mark.parametrize("name, body, says", [
    # 2048 messages of 128 tool calls each: 262k calls in 9 MB, each message within its own cap
    ("262k tool calls", _compact({**_ask(), "messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "f"}}] * 128}] * 2048}), "tool calls; at most 1024"),
    # 128 tools of 10k parameters each in 12 MB: every tool within its own caps
    ("128 tools x 10k parameters", _compact({**_ask(), "tools": [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": {
            str(j): {} for j in range(10_000)}}}} for i in range(128)]}), "schemas hold more than"),
])
def test_what_a_request_holds_is_counted_whole_and_no_one_waits_behind_it(served, name, body, says):
    """Caps counted over the whole request, before any per-item work; a big body's checks run off the event loop,
    so a /v1/models poller beside it keeps its answers coming (before: every request stalled 4-9 s)."""
    waits = []

    async def poll(s, stop):
        while not stop.is_set():
            t0 = time.perf_counter()
            async with s.get(f"{served.url}/v1/models") as r:
                assert r.status == 200
            waits.append(time.perf_counter() - t0)
            await asyncio.sleep(0.02)

    async def go():
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as s:
            poller = asyncio.ensure_future(poll(s, stop))
            got = await _post(s, f"{served.url}/v1/chat/completions", body)
            normal = await _post(s, f"{served.url}/v1/chat/completions", _ask())
            stop.set()
            await poller
            return got, normal

    (status, answer, _), (ok, _, _) = asyncio.run(go())
    assert ok == 200 and status == 400 and says in answer["error"]["message"], answer
    assert waits and max(waits) < 2.0, (name, max(waits))


def test_a_host_that_only_starts_like_loopback_is_refused(served):
    hosts = ["[::1]evil.com", "localhost.evil.com", "127.0.0.1.evil.com:80", "localhost:80:80", "[::1]:80x"]
    answers = _beside_good_ones(served.url, [_ask()] * len(hosts))  # the good ones, then the same bodies...
    assert [a[0] for a in answers] == [200] * len(hosts)

    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*[_post(s, f"{served.url}/v1/chat/completions", _ask(), {"Host": h})
                                          for h in hosts + ["[::1]:1234", "localhost", "127.0.0.1:9"]])

    got = [status for status, _, _ in asyncio.run(go())]
    assert got == [403] * len(hosts) + [200, 200, 200], got


def test_malformed_requests_and_unknown_routes_are_answered_in_json_and_logged_in_one_line(served):
    n = len(served.lines)
    garbage = _json_answer(_raw(served.port, b"GARBAGE\r\n\r\n"))
    bad_header = _json_answer(_raw(served.port, b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header\r\n\r\n"))
    nowhere = _json_answer(_raw(served.port, b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"))
    method = _json_answer(_raw(served.port, b"DELETE /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                            b"Connection: close\r\n\r\n"))
    assert [a[0] for a in (garbage, bad_header, nowhere, method)] == [400, 400, 404, 405]
    for _, body, _ in (garbage, bad_header, nowhere, method):
        assert set(body["error"]) == {"message", "type", "param", "code"}, body  # the OpenAI error shape
    log = served.log_since(n)
    assert "Traceback" not in log, log
    assert 1 <= log.count("masrl http: 400") <= 2, log  # one line a malformed request


def test_a_bad_authorization_header_gets_a_401_not_a_500():
    from masrl.driver.serving.gateway import Gateway

    async def go():
        gw = Gateway(api_key="s3cret")
        await gw.start()
        try:
            replies = [await asyncio.to_thread(_raw, gw.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                               b"Authorization: Bearer " + key + b"\r\nContent-Length: 2\r\n"
                                               b"Connection: close\r\n\r\n{}") for key in (b"\xff", b"\xed\xa0\x80")]
        finally:
            await gw.stop()
        return replies

    for reply in asyncio.run(go()):
        status, body, _ = _json_answer(reply)
        assert status == 401 and "API key" in body["error"]["message"], body


@pytest.mark.parametrize("argv", [["serve", str(CONFIG), "model=tiny-random"], ["retriever", "serve", "--corpus", "{corpus}"]])
def test_a_port_out_of_range_is_one_line(argv, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "1", "text": "a document"}) + "\n")
    argv = [a.replace("{corpus}", str(corpus)) for a in argv]
    out = subprocess.run([sys.executable, "-m", "masrl.cli", *argv, "--port", "99999"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") == 0 and "port 99999: a port is 0-65535" in out.stderr, out.stderr


# -- the retriever ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer

    corpus = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"document {i} about the mayor"}) + "\n"
                              for i in range(20)))
    server = RetrieverServer(BM25Index.load(corpus), idle_timeout_s=2).start()
    yield server
    server.stop()


def _retrieve_beside_good_ones(server, bad: list[bytes], headers: dict | None = None):
    async def go():
        async with aiohttp.ClientSession() as s:
            good = [_post(s, f"{server.url}/retrieve", {"queries": [f"mayor {i}"], "topk": 2}) for i in range(6)]
            bads = [_post(s, f"{server.url}/retrieve", b, headers) for b in bad]
            out = await asyncio.gather(*good, *bads)
            return out[:6], out[6:]

    good, bads = asyncio.run(go())
    assert [status for status, _, _ in good] == [200] * 6
    return bads


def test_the_retriever_answers_deep_bodies_and_huge_numbers_with_a_json_400(retriever):
    deep = b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    digits = b'{"queries": ["mayor"], "topk": ' + b"7" * 5000 + b"}"
    for status, body, _ in _retrieve_beside_good_ones(retriever, [deep, digits]):
        assert status == 400 and isinstance(body.get("error"), str), body


def test_the_retriever_answers_only_loopback_hosts_without_a_key_and_a_bad_gzip_body_with_a_400(retriever):
    ok = json.dumps({"queries": ["mayor"]}).encode()
    (status, body, _), = _retrieve_beside_good_ones(retriever, [ok], {"Host": "attacker.example"})
    assert status == 403 and "loopback" in body["error"], body
    bad = gzip.compress(ok)[:-8] + b"xxxxxxxx"
    status, body, _ = _json_answer(_raw(retriever.port, b"POST /retrieve HTTP/1.1\r\nHost: localhost\r\n"
                                                        b"Content-Type: application/json\r\nContent-Encoding: gzip\r\n"
                                                        b"Content-Length: %d\r\n\r\n" % len(bad) + bad))
    assert status == 400 and "could not be read" in body["error"], body
    status, body, _ = _json_answer(_raw(retriever.port, b"BOGUS\r\n\r\n"))
    assert status == 400 and "malformed" in body["error"]


def test_a_retriever_with_a_key_serves_any_host_that_sends_it(tmp_path):
    from masrl.tools.retrieval import RetrieverClient
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "1", "text": "the mayor of Vellin"}) + "\n")
    server = RetrieverServer(BM25Index.load(corpus), api_key="k3y").start()
    try:
        rows = RetrieverClient(server.url, api_key="k3y").retrieve(["mayor"], 1)
        assert rows[0][0]["id"] == "1"
        with pytest.raises(Exception, match="API key"):
            RetrieverClient(server.url).retrieve(["mayor"], 1)
    finally:
        server.stop()
