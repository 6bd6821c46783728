"""Hostile input against `masrl serve` as it ships (a real subprocess on 127.0.0.1, the LoRA math team
on tiny-random), probed with raw sockets and aiohttp. Every bad request is sent beside good ones:
the bad one gets its 4xx, the good ones are answered."""

from __future__ import annotations

import asyncio
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


@pytest.fixture(scope="module")
def served():
    proc, url, _ = start_serve(CONFIG, "model=tiny-random", "--read-timeout-s", "2", "--max-connections", "1100",
                               timeout_s=180)
    port = int(url.rsplit(":", 1)[1])
    yield url, port
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


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


def _run(coro):
    return asyncio.run(coro)


def _innocents(url):
    """Eight good requests across the four adapters."""
    return [(f"{url}/v1/chat/completions", _ask(AGENTS[i % 4], f"What is {i} + 1?")) for i in range(8)]


def test_one_bad_request_in_a_batch_fails_alone(served):
    url, _ = served
    bad_chat = _ask("solver", "a\ud800b")  # json.dumps writes the lone surrogate as \ud800
    bad_completion = {"model": "refiner", "prompt": "a\udfffb", "max_tokens": 4}

    async def go():
        async with aiohttp.ClientSession() as s:
            out = []
            for _ in range(3):  # three trials, each all at once so they share engine batches
                jobs = [_post(s, u, b) for u, b in _innocents(url)]
                jobs += [_post(s, f"{url}/v1/chat/completions", bad_chat), _post(s, f"{url}/v1/completions", bad_completion)]
                out.append(await asyncio.gather(*jobs))
            return out

    for trial in _run(go()):
        assert [status for status, _, _ in trial[:8]] == [200] * 8
        for status, body, _ in trial[8:]:
            assert status == 400 and "lone UTF-16 surrogate" in body["error"]["message"], body


@pytest.mark.parametrize("body, param", [
    ({"model": ["solver"], "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": {"a": 1}, "messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": "solver", "messages": [{"role": "assistant", "content": "x", "tool_calls": 5}]}, "messages[0].tool_calls"),
    (_ask(temperature=10 ** 400), "temperature"),
    (_ask(temperature=-1), "temperature"),
    (_ask(temperature=1000), "temperature"),
    (_ask(top_p=2), "top_p"),
    (_ask(top_p=-1), "top_p"),
    (_ask(stop=""), "stop"),
    (_ask(tool_choice="required", tools=[{"type": "function", "function": {"name": "f"}}]), "tool_choice"),
    (_ask(tools=[{"type": "function", "function": {"name": "f", "parameters": "garbage"}}]), "tools[0].function.parameters"),
    (_ask(tools=[{"type": "function", "function": {"name": "no spaces allowed"}}]), "tools[0].function.name"),
    (_ask(presence_penalty=0.5), "presence_penalty"),
    (_ask(frobnicate=True), "frobnicate"),
    (_ask(top_logprobs=3), "top_logprobs"),
])
def test_bad_fields_get_a_400_naming_them_while_a_good_request_is_served(served, body, param):
    url, _ = served

    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(_post(s, f"{url}/v1/chat/completions", body),
                                        _post(s, f"{url}/v1/chat/completions", _ask()))

    (status, got, _), (ok, _, _) = _run(go())
    assert status == 400 and got["error"]["param"] == param, got
    assert ok == 200


def test_raw_bodies_that_once_broke_the_server_get_a_400(served):
    url, _ = served
    deep = b'{"model": "solver", "messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    nan = b'{"model": "verifier", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'
    inf = b'{"model": "verifier", "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}'

    async def go():
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*[_post(s, f"{url}/v1/chat/completions", b) for b in (deep, nan, inf)],
                                        _post(s, f"{url}/v1/chat/completions", _ask()))

    *bad, (ok, _, _) = _run(go())
    assert [status for status, _, _ in bad] == [400, 400, 400], bad
    assert "nested too deeply" in bad[0][1]["error"]["message"]
    assert bad[1][1]["error"]["param"] == "temperature" and bad[2][1]["error"]["param"] == "top_p"
    assert ok == 200


def test_a_15_mb_body_is_refused_before_tokenising_while_a_normal_request_is_answered(served):
    url, _ = served
    big = _ask("solver", "x" * 15_000_000)

    async def go():
        async with aiohttp.ClientSession() as s:
            first = asyncio.ensure_future(_post(s, f"{url}/v1/chat/completions", big))
            await asyncio.sleep(1.0)
            t0 = time.perf_counter()
            normal = await _post(s, f"{url}/v1/chat/completions", _ask("verifier"))
            waited = time.perf_counter() - t0
            return await first, normal, waited

    (status, body, _), (ok, _, _), waited = _run(go())
    assert ok == 200 and waited < 2.0, waited
    assert status == 400 and "refused before tokenising" in body["error"]["message"], body


def test_the_developer_role_works_and_logprobs_come_back(served):
    url, _ = served
    body = {"model": "solver", "max_tokens": 6, "temperature": 1.0, "logprobs": True, "top_logprobs": 3,
            "messages": [{"role": "developer", "content": "Answer briefly."}, {"role": "user", "content": "2 + 2?"}]}

    async def go():
        async with aiohttp.ClientSession() as s:
            chat = await _post(s, f"{url}/v1/chat/completions", body)
            comp = await _post(s, f"{url}/v1/completions", {"model": "refiner", "prompt": "1 2 3", "max_tokens": 5,
                                                           "logprobs": 2})
            return chat, comp

    (status, got, _), (cstatus, comp, _) = _run(go())
    assert status == 200, got
    choice = got["choices"][0]
    rows = choice["logprobs"]["content"]
    assert len(rows) == got["usage"]["completion_tokens"] > 0
    assert "".join(r["token"] for r in rows) == choice["message"]["content"]
    for r in rows:
        tops = r["top_logprobs"]
        assert len(tops) == 3 and tops[0]["logprob"] >= tops[1]["logprob"] >= tops[2]["logprob"]
        assert r["logprob"] <= tops[0]["logprob"] + 1e-3  # nothing likelier than the likeliest
        same = [t["logprob"] for t in tops if t["token"] == r["token"]]
        if same:  # the sampled token's logprob as the engine drew it equals a forward pass's value
            assert abs(same[0] - r["logprob"]) < 1e-3
    assert cstatus == 200 and len(comp["choices"][0]["logprobs"]["tokens"]) == comp["usage"]["completion_tokens"]


def test_half_sent_requests_are_closed_in_time_and_new_clients_are_served_during_a_flood(served):
    url, port = served
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process holds the 1,000 client sockets
    if soft != resource.RLIM_INFINITY and soft < 2048:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(2048, hard) if hard != resource.RLIM_INFINITY else 2048, hard))
    half_body = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 500\r\n\r\n{\"model\": ")
    half_head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0."
    flood, opened = [], []
    t0 = time.perf_counter()
    for i in range(1000):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(half_body if i % 2 else half_head)
        flood.append(sock)
        opened.append(time.perf_counter())

    async def go():
        async with aiohttp.ClientSession() as s:
            return await _post(s, f"{url}/v1/chat/completions", _ask())

    status, _, _ = _run(go())
    assert status == 200  # a new client is served while 1,000 half requests hang
    closed, open_ = 0, []
    for i, sock in enumerate(flood):
        deadline = opened[i] + 2 + 6  # each within the read timeout (2 s), with slack for a loaded CI machine
        sock.settimeout(max(0.1, deadline - time.perf_counter()))
        try:
            data = b""
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
            closed += 1
        except socket.timeout:
            open_.append((i, data[:80]))
        finally:
            sock.close()
    assert closed == 1000, (time.perf_counter() - t0, open_[:5])


def test_no_key_means_loopback_hosts_only_and_the_server_names_no_versions(served):
    url, _ = served

    async def go():
        async with aiohttp.ClientSession() as s:
            evil = await _post(s, f"{url}/v1/chat/completions", _ask(), headers={"Host": "evil.example:8000"})
            local = await _post(s, f"{url}/v1/chat/completions", _ask(), headers={"Host": "localhost"})
            return evil, local

    (status, body, _), (ok, _, headers) = _run(go())
    assert status == 403 and "loopback" in body["error"]["message"]
    assert ok == 200 and headers["Server"] == "masrl"


def test_a_port_in_use_is_one_line_before_any_model_loads():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        out = subprocess.run([sys.executable, "-m", "masrl.cli", "serve", str(CONFIG), "model=tiny-random", "--port",
                              str(port)], capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert out.returncode == 2  # what the CLI exits with on a MasrlError
    assert out.stderr.strip().count("\n") == 0 and f"cannot listen on 127.0.0.1:{port}" in out.stderr, out.stderr
    assert "loading" not in out.stdout  # refused before any model loaded


def test_a_key_is_checked_and_connections_past_the_cap_get_a_503():
    from masrl.driver.serving.gateway import Gateway
    from masrl.web.server import ServerLimits

    async def go():
        gw = Gateway(api_key="s3cret", limits=ServerLimits(max_connections=5, idle_timeout_s=5))
        await gw.start()
        async with aiohttp.ClientSession() as s:
            wrong = await _post(s, f"{gw.url}/v1/chat/completions", _ask(), headers={"Authorization": "Bearer s3cre"})
            longer = await _post(s, f"{gw.url}/v1/chat/completions", _ask(), headers={"Authorization": "Bearer " + "x" * 999})
        held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(5)]
        await asyncio.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", gw.port))
        extra.settimeout(5)
        reply = await asyncio.to_thread(extra.recv, 4096)
        for sock in held + [extra]:
            sock.close()
        await gw.stop()
        return wrong, longer, reply.decode()

    wrong, longer, reply = _run(go())
    assert wrong[0] == 401 and longer[0] == 401
    assert reply.startswith("HTTP/1.1 503") and "too many open connections" in reply


def test_the_retriever_serves_new_clients_through_an_idle_flood(tmp_path):
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer, wait_healthy

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"document {i} about the mayor"}) + "\n" for i in range(20)))
    server = RetrieverServer(BM25Index.load(corpus), idle_timeout_s=30).start()
    try:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(300)]
        t0 = time.perf_counter()
        assert wait_healthy(server.url, 30) and time.perf_counter() - t0 < 30  # no 503: idle sockets hold no thread
        assert server.refused == 0
        for sock in idle:
            sock.close()
    finally:
        server.stop()
