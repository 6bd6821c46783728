"""The servers' own edges (the gateway and the retriever share the HTTP stack, ``masrl.web.server``): a limit out of its
range is refused before the server starts; a key never reaches the log or an answer, whatever the
Authorization header holds; without a key, a web page the user opens cannot reach the server blind (a
cross-origin ``Origin`` or a body that is not JSON is refused). Each bad request is sent beside good ones."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

from masrl.cli import main
from masrl.errors import ConfigError
from masrl.web import server as web

KEY = "sekrit-KEY-8f3a2c"


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"document {i} about the mayor"}) + "\n"
                              for i in range(20)))
    return corpus


@pytest.fixture()
def server(tmp_path, request):
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer

    srv = RetrieverServer(BM25Index.load(_corpus(tmp_path)), api_key=getattr(request, "param", None)).start()
    yield srv
    srv.stop()


def _raw(port: int, head: bytes, body: bytes = b'{"queries": ["mayor"], "topk": 1}') -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            out += chunk
    return out


def _post(port: int, *headers: bytes) -> bytes:
    return _raw(port, b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + b"".join(
        h + b"\r\n" for h in headers))


@pytest.mark.parametrize("kwargs", [dict(idle_timeout_s=0), dict(idle_timeout_s=float("nan")),
                                    dict(body_timeout_s=float("inf")), dict(max_connections=0),
                                    dict(max_connections=-5), dict(max_body_bytes=0)])
def test_a_server_limit_out_of_range_is_refused(kwargs):
    with pytest.raises(ConfigError, match="out of range"):
        web.ServerLimits(**kwargs)


@pytest.mark.parametrize("argv", [["serve", "math/solver", "--max-body-mb", "0"],
                                  ["serve", "math/solver", "--read-timeout-s", "nan"],
                                  ["serve", "math/solver", "--max-connections", "-1"],
                                  ["retriever", "serve", "--corpus", "x.jsonl", "--idle-timeout", "inf"]])
def test_a_server_flag_out_of_range_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "is out of range; give" in capsys.readouterr().err


@pytest.mark.parametrize("server", [KEY], indirect=True)
def test_no_authorization_header_puts_the_key_in_the_log_or_an_answer(server, caplog):
    bad = [b"Bearer " + KEY.encode() + b" \x00", b"Bearer " + KEY.encode() + b"\xff", b"Bearer\t" + KEY.encode(),
           "Bearer é".encode() + KEY.encode(), b"Bearer " + KEY.encode() + b"\x7f", b"bearer " + KEY.encode()[:-1],
           KEY.encode(), b"Bearer " + b"\x80" * 4 + KEY.encode()]
    answers = []
    with caplog.at_level(logging.DEBUG):
        for header in bad:
            answers.append(_post(server.port, b"Content-Type: application/json", b"Authorization: " + header))
            good = _post(server.port, b"Content-Type: application/json", b"Authorization: Bearer " + KEY.encode())
            assert good.startswith(b"HTTP/1.1 200"), good[:200]
    assert all(a.split(b" ")[1] in (b"400", b"401") for a in answers), [a[:40] for a in answers]
    assert KEY not in caplog.text and not any(KEY.encode() in a for a in answers)
    assert "400" in caplog.text  # the malformed ones were logged, without their bytes


def test_without_a_key_a_web_page_cannot_reach_the_server_blind(server):
    json_ct = b"Content-Type: application/json"
    assert _post(server.port, json_ct).startswith(b"HTTP/1.1 200")
    assert _post(server.port, json_ct, b"Origin: http://localhost:3000").startswith(b"HTTP/1.1 200")  # a local page
    for origin in (b"https://evil.example", b"null", b"http://127.0.0.1.evil.example"):
        got = _post(server.port, json_ct, b"Origin: " + origin)
        assert got.startswith(b"HTTP/1.1 403") and b"cross-origin" in got, got[:300]
    for ctype in (b"text/plain", b"application/x-www-form-urlencoded", b"multipart/form-data; boundary=x"):
        got = _post(server.port, b"Content-Type: " + ctype)
        assert got.startswith(b"HTTP/1.1 415") and b"application/json" in got, got[:300]
    assert _post(server.port, json_ct).startswith(b"HTTP/1.1 200")  # and it still serves
