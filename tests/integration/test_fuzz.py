"""Property-based fuzzing of every input path a stranger reaches (issue 60): the gateway's request schema against
`masrl serve` as it ships (tiny-random), the retriever's, raw HTTP bytes, the workflow expression grammar, graph
YAML and what a reward plugin returns (model replies to every shipped workflow: test_reply_fuzz.py).
The properties: a 200 or a 4xx in the server's JSON error shape, never a 5xx, each answer in bounded time;
an expression loads or fails with ExprError and evaluates or fails with EvalError, within its time limit; a graph
loads or is a ConfigError; a reward's value is taken or fails its trace with RewardFailure, never anything else.

The budget is fixed (``FUZZ_EXAMPLES`` per test, default in ``BUDGET``); each run draws new cases, so the
tests keep looking. A failure prints the case and hypothesis's seed to reproduce it."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tinycfg import start_serve  # noqa: E402

from masrl.families import config_path  # noqa: E402

pytestmark = pytest.mark.slow  # the slow tier (make test-fast leaves it out)

ROOT = Path(__file__).resolve().parents[2]
BUDGET = {"gateway": 300, "raw": 200, "retriever": 400, "expr": 2000, "reward": 500, "graph": 400}
AGENTS = ["solver", "verifier", "refiner", "finalizer"]
SLOW_S = 30.0  # one request's or evaluation's answer (the server's own read timeout here is 5 s), on a loaded machine


def _examples(kind: str) -> int:
    return int(os.environ.get("FUZZ_EXAMPLES", BUDGET[kind]))


def _settings(kind: str):
    # FUZZ_DERANDOMIZE=1 (CI sets it): the same cases every run, so a landing is not decided by the draw; a plain
    # `make test` draws fresh cases and keeps looking
    return settings(max_examples=_examples(kind), deadline=None, database=None,
                    derandomize=os.environ.get("FUZZ_DERANDOMIZE") == "1",
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# -- values ---------------------------------------------------------------------------------------------------

# JSON that costs more to read than its size suggests: deep nesting, a number past Python's 4,300-digit limit
HOSTILE_JSON = ["[" * 500 + "]" * 500, "[" * 5000 + "]" * 5000, '{"x": ' + "9" * 5000 + "}", "[1" + ", 1" * 20000 + "]"]
text = st.one_of(st.text(max_size=40), st.sampled_from(["", "\x00", "\ud800", "a" * 5000, "<tool_call>{}</tool_call>"]))
numbers = st.one_of(st.integers(), st.integers(min_value=-(10 ** 60), max_value=10 ** 60), st.floats(allow_nan=True),
                    st.sampled_from([0, 1, -1, 2 ** 63, 10 ** 400, 1e308]))
scalars = st.one_of(st.none(), st.booleans(), numbers, text)
anything = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                         st.dictionaries(text, inner, max_size=5)), max_leaves=20)


def _maybe(strategy):
    """Mostly the well-formed value, now and then anything at all."""
    return st.integers(0, 9).flatmap(lambda k: anything if k == 0 else strategy)


content = _maybe(st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=4)))
tool_call = st.fixed_dictionaries({"id": _maybe(text), "type": st.just("function"),
                                   "function": st.fixed_dictionaries({"name": _maybe(text),
                                                                      "arguments": _maybe(st.one_of(
                                                                          st.just("{}"), st.builds(json.dumps, anything),
                                                                          st.sampled_from(HOSTILE_JSON)))})})
message = st.fixed_dictionaries(
    {"role": _maybe(st.sampled_from(["system", "developer", "user", "assistant", "tool"])), "content": content},
    optional={"tool_calls": _maybe(st.lists(tool_call, max_size=3)), "name": text})
tool = st.fixed_dictionaries({"type": _maybe(st.just("function")), "function": _maybe(st.fixed_dictionaries(
    {"name": _maybe(st.from_regex(r"[a-z_]{1,10}", fullmatch=True))},
    optional={"description": _maybe(text), "parameters": _maybe(st.just({"type": "object", "properties": {}}))}))})
chat = st.fixed_dictionaries(
    {"model": _maybe(st.sampled_from(AGENTS)), "messages": _maybe(st.lists(message, min_size=1, max_size=4))},
    optional={"max_tokens": _maybe(st.integers(1, 4)), "temperature": _maybe(st.floats(0, 2)),
              "top_p": _maybe(st.floats(0.01, 1)), "stop": _maybe(text), "logprobs": _maybe(st.booleans()),
              "top_logprobs": _maybe(st.integers(0, 20)), "seed": _maybe(st.integers(0, 2 ** 62)), "n": _maybe(st.just(1)),
              "stream": _maybe(st.just(False)), "tools": _maybe(st.lists(tool, max_size=3)),
              "tool_choice": _maybe(st.sampled_from(["auto", "none", "required"])), "user": text})
# now and then a field the gateway does not take, or takes only at its neutral value
chat = st.integers(0, 5).flatmap(lambda k: chat if k else st.tuples(
    chat, st.sampled_from(["presence_penalty", "frobnicate", "echo"]), anything).map(lambda t: {**t[0], t[1]: t[2]}))
completion = st.fixed_dictionaries({"model": _maybe(st.sampled_from(AGENTS)), "prompt": _maybe(text)},
                                   optional={"max_tokens": _maybe(st.integers(1, 4)), "logprobs": _maybe(st.integers(0, 5)),
                                             "best_of": _maybe(st.just(1))})


def _body(draw_value) -> bytes:
    if isinstance(draw_value, bytes):
        return draw_value
    try:
        return json.dumps(draw_value, allow_nan=True).encode("utf-8", "surrogatepass")
    except (ValueError, OverflowError):
        return b"{}"


def _post(port: int, path: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.perf_counter()
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read(), time.perf_counter() - t0
    finally:
        conn.close()


def _check_answer(status: int, data: bytes, took: float, case) -> dict | None:
    assert status < 500, (status, data[:300], case)
    assert took < SLOW_S, (took, case)
    if status >= 400:
        err = json.loads(data)["error"]
        return err
    return None


# -- the gateway ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served():
    proc, url, _ = start_serve(config_path("math/team_lora"), "model=tiny-random", "--read-timeout-s", "5",
                               timeout_s=180)
    yield int(url.rsplit(":", 1)[1])
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()


@_settings("gateway")
@given(case=st.one_of(chat.map(lambda b: ("/v1/chat/completions", b)),
                      completion.map(lambda b: ("/v1/completions", b)),
                      anything.map(lambda b: (("/v1/chat/completions", "/v1/completions")[len(str(b)) % 2], b))))
def test_the_gateway_answers_every_request_with_a_200_or_a_json_4xx_in_bounded_time(served, case):
    path, body = case
    status, data, took = _post(served, path, _body(body))
    err = _check_answer(status, data, took, case)
    if err is not None:
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status, err
    else:
        assert json.loads(data)["choices"], data[:200]


def test_a_prompt_the_tokenizer_drops_entirely_gets_a_400_beside_a_good_one(served):
    """Found by the gateway fuzzer: a completion prompt of one control character tokenised to nothing, and the
    engine failed the call with a 503."""
    status, data, _ = _post(served, "/v1/completions", _body({"model": "solver", "prompt": "\x16"}))
    assert status == 400 and "empty once tokenised" in json.loads(data)["error"]["message"], data[:300]
    status, data, _ = _post(served, "/v1/completions", _body({"model": "solver", "prompt": "2 + 2 =", "max_tokens": 4}))
    assert status == 200 and json.loads(data)["choices"], data[:300]


raw_request = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda path, host, auth, body: b"POST " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\n" + auth
              + b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
              st.sampled_from([b"/v1/chat/completions", b"/v1/completions"]),
              st.sampled_from([b"127.0.0.1", b"localhost:1", b"[::1]evil.com", b"127.0.0.1.evil.com", b"[::1]:8"]),
              st.sampled_from([b"", b"Authorization: Bearer \xff\r\n"]), st.binary(max_size=60)),
    st.builds(lambda method, path, headers, body: method + b" " + path + b" HTTP/1.1\r\n" + headers + b"\r\n" + body,
              st.sampled_from([b"GET", b"POST", b"PUT", b"BREW", b"G\x00T", b""]),
              st.sampled_from([b"/v1/models", b"/v1/chat/completions", b"/%%", b"/" + b"a" * 9000, b"*"]),
              st.lists(st.sampled_from([b"Host: 127.0.0.1\r\n", b"Host: evil\r\n", b"Content-Length: 5\r\n",
                                        b"Content-Length: -1\r\n", b"Transfer-Encoding: chunked\r\n",
                                        b"Content-Encoding: gzip\r\n", b"Bad Header\r\n", b"X: \xff\r\n"]),
                       max_size=5).map(b"".join),
              st.binary(max_size=50)))


@_settings("raw")
@given(payload=raw_request)
def test_raw_bytes_never_get_a_5xx_and_the_connection_always_ends(served, payload):
    sock = socket.create_connection(("127.0.0.1", served))
    sock.sendall(payload)
    sock.shutdown(socket.SHUT_WR)  # the whole request is sent; a server waiting for more must give up
    sock.settimeout(SLOW_S)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        pytest.fail(f"no end within {SLOW_S} s for {payload[:100]!r}")
    finally:
        sock.close()
    for status in re.findall(rb"(?:^|\r\n)HTTP/1\.[01] (\d{3}) ", data):  # every response on the connection
        assert int(status) < 500, (payload[:200], data[:300])


# -- the retriever ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    from masrl.tools.retrieval.index import BM25Index
    from masrl.tools.retrieval.server import RetrieverServer

    corpus = tmp_path_factory.mktemp("fuzz") / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "text": f"entry {i} on the city of Vellin"}) + "\n"
                              for i in range(30)))
    server = RetrieverServer(BM25Index.load(corpus), idle_timeout_s=5).start()
    yield server
    server.stop()


retrieve_body = st.one_of(
    st.fixed_dictionaries({"queries": _maybe(st.lists(text, max_size=4))},
                          optional={"topk": _maybe(st.one_of(st.integers(-5, 200), numbers)),
                                    "return_scores": anything, "extra": anything}),
    anything, st.binary(max_size=200),
    st.sampled_from(HOSTILE_JSON).map(lambda j: ('{"queries": ["city"], "topk": %s}' % j).encode()),
    st.sampled_from(HOSTILE_JSON).map(lambda j: ('{"queries": %s}' % j).encode()))


@_settings("retriever")
@given(body=retrieve_body)
def test_the_retriever_answers_every_body_with_a_200_or_a_json_4xx_in_bounded_time(retriever, body):
    status, data, took = _post(retriever.port, "/retrieve", _body(body))
    err = _check_answer(status, data, took, body)
    if err is not None:
        assert isinstance(err, str)
    else:
        assert isinstance(json.loads(data)["result"], list)


# -- the expression language ------------------------------------------------------------------------------------

NAMES = ["xs", "s", "n", "d", "task", "node"]
ENV = {"xs": list(range(50)), "s": "hello world", "n": 7, "d": {"a": [1, 2], "b": "x"},
       "task": {"question": "q", "meta": {"type": "two_hop"}}, "node": {"answer": "4", "queries": ["a", "b"]}}


def _expressions():
    from masrl.workflows.expr import FUNCTIONS

    leaf = st.one_of(st.sampled_from(NAMES + ["true", "none", "node.answer", "task.meta.type", "d['a']", "xs[0]"]),
                     st.integers(-10 ** 6, 10 ** 6).map(str), st.sampled_from(["1000000", "10 ** 9", "1e308", "-0.0"]),
                     text.map(repr))

    def grow(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "%", "==", "!=", "<", "in", "not in", "and", "or"]),
                      inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(st.sampled_from(sorted(FUNCTIONS)), st.lists(inner, max_size=3)).map(
                lambda t: f"{t[0]}({', '.join(t[1])})"),
            st.lists(inner, max_size=4).map(lambda xs: f"[{', '.join(xs)}]"),
            st.tuples(inner, inner).map(lambda t: f"{t[0]}[{t[1]}]"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
            inner.map(lambda x: f"not {x}"), inner.map(lambda x: f"-{x}"))

    return st.one_of(st.recursive(leaf, grow, max_leaves=12), st.text(max_size=60),
                     st.sampled_from(["x" * 5000, "(" * 300 + ")" * 300, "a." * 2000 + "b", "__import__('os')",
                                      "join(['a' * 1000000] * 100, '')", "str([1] * 1000000)"]))


@_settings("expr")
@given(src=_expressions())
def test_every_expression_loads_or_says_why_and_evaluates_or_says_why_within_its_limits(src):
    from masrl.workflows.expr import EvalError, ExprError, compile_expr
    from masrl.workflows.expr_bounds import MAX_SECONDS

    t0 = time.perf_counter()
    try:
        e = compile_expr(src)
    except ExprError:
        assert time.perf_counter() - t0 < SLOW_S
        return
    t0 = time.perf_counter()
    try:
        e(ENV)
    except EvalError:
        pass
    assert time.perf_counter() - t0 < MAX_SECONDS + SLOW_S, src


# -- what a reward plugin returns, and graph YAML ----------------------------------------------------------------

reward_values = st.one_of(scalars, anything, st.sampled_from(["1.0", b"1", object(), float("inf"), -float("inf")]),
                          st.integers(min_value=-(10 ** 500), max_value=10 ** 500))


def _numpy_values():
    np = pytest.importorskip("numpy")
    return st.one_of(st.floats(allow_nan=True, width=32).map(np.float32), st.integers(-2**62, 2**62).map(np.int64),
                     st.floats(allow_nan=True).map(np.float64), st.just(np.array([1.0, 2.0])))


@_settings("reward")
@given(values=st.lists(st.one_of(reward_values, _numpy_values()), min_size=1, max_size=3),
       shape=st.sampled_from(["list", "tuple", "generator", "none", "dict", "str"]))
def test_whatever_a_reward_returns_is_taken_or_fails_its_trace_with_reward_failure(values, shape):
    import math

    from masrl.data.tasks import Task
    from masrl.rewards import RewardFailure, combine
    from masrl.trace import Call, RewardAssignment, Trace

    trace = Trace("t", "task", 0)
    trace.calls = [Call(f"c{i}", "t", "task", 0, "solver", "p", 0, []) for i in range(len(values))]
    assigned = [RewardAssignment(f"c{i}", v, "fuzz") for i, v in enumerate(values)]

    class Plugin:
        name = "fuzz"

        def allocate(self, tr, task):
            return {"list": lambda: assigned, "tuple": lambda: tuple(assigned), "generator": lambda: iter(assigned),
                    "none": lambda: None, "dict": lambda: {"a": 1}, "str": lambda: "c0"}[shape]()

    try:
        totals = combine(trace, Task("task", "q", "a"), [Plugin()], timeout_s=30)
    except RewardFailure:
        return
    assert all(isinstance(v, float) and math.isfinite(v) and abs(v) <= 1e6 for v in totals.values())


def _graphs():
    node_names = st.sampled_from(["ask", "steps", "task", "join", "x", "end", "answer", "calls"])
    expr = st.one_of(st.sampled_from(["ask.text", "ask.answer", "task.question", "[1] * 100000", "visits.ask",
                                      "steps < 3", "join(ask.text, 5)", "none", "x.y", "calls"]), text)
    node = st.fixed_dictionaries({"type": st.sampled_from(["llm", "tool", "bogus"]), "agent": st.sampled_from(["a", "b"]),
                                  "prompt": st.one_of(expr.map(lambda e: "{" + e + "}"), text),
                                  "next": st.one_of(node_names, st.just("end"))},
                                 optional={"foreach": expr, "tool": st.sampled_from(["search", "nope"])})
    return st.fixed_dictionaries({"agents": st.dictionaries(st.sampled_from(["a", "b"]), st.one_of(
        st.just({}), st.just({"parser": {"tags": ["answer"]}}), st.just({"parser": {"json": "q"}}), anything),
        max_size=2),
        "start": node_names, "nodes": st.dictionaries(node_names, node, max_size=3),
        "answer": expr}, optional={"max_steps": numbers, "max_calls": numbers, "score": st.sampled_from(["qa", "x"])})


@_settings("graph")
@given(graph=st.one_of(_graphs(), anything))
def test_every_graph_loads_or_is_a_config_error(graph):
    from masrl.errors import ConfigError
    from masrl.workflows.graph import Graph

    try:
        Graph(graph=graph)
    except ConfigError:
        pass
