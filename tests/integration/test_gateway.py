"""The OpenAI-compatible gateway on 127.0.0.1, driven by real HTTP clients (aiohttp and the official
openai client) against a tiny real model: bad input, disconnects, concurrency, nothing lost."""

import asyncio
import json
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from tinycfg import prepared_trainer, tiny_config

from masrl.config import load_config
from masrl.driver.rollout.context import WorkflowContext
from masrl.driver.run.loop import Trainer
from masrl.driver.serving.gateway import Gateway
from masrl.driver.serving.wire import chat_response
from masrl.errors import MasrlError
from masrl.trace import Call, Trace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))


def _data(tmp_path, **options):
    data = tiny_config("examples/external_openai_team.yaml", tmp_path, steps=1)
    data["workflow"]["options"].update(options)
    return data


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gw")
    data = _data(tmp)
    # long enough to disconnect in the middle of, on any machine: 1500 tokens, EOS ignored
    data["agents"]["solver"].update(max_new_tokens=1500, ignore_eos=True)
    tr, _, _ = prepared_trainer(data, tmp)
    return tr


def _episode(tr):
    trace = Trace("t-gw", "task-1", 0)
    ctx = WorkflowContext(trace, tr.rt.agents, tr.rt.controller.submit, train=True, call_timeout_s=60, seed=1)
    return trace, ctx


async def _post(session, url, body, **kw):
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **kw.pop("headers", {})},
                            **kw) as r:
        return r.status, await r.json()


def _ask(agent="checker", content="What is 2 + 2?", **extra):
    return {"model": agent, "messages": [{"role": "user", "content": content}], **extra}


def test_bad_input_gets_a_status_that_names_the_problem(trainer):
    async def go():
        gw = Gateway()
        await gw.start()
        trace, ctx = _episode(trainer)
        rid, base = gw.open(ctx)
        done_rid, done_base = gw.open(_episode(trainer)[1])
        gw.finish(done_rid)
        out = {}
        async with aiohttp.ClientSession() as s:
            out["json"] = await _post(s, f"{base}/chat/completions", b"{not json")
            out["role"] = await _post(s, f"{base}/chat/completions",
                                      {"model": "checker", "messages": [{"role": "user", "content": "hi"},
                                                                        {"role": "wizard", "content": "x"}]})
            out["model"] = await _post(s, f"{base}/chat/completions", _ask("chekcer"))
            out["stream"] = await _post(s, f"{base}/chat/completions", _ask(stream="yes"))
            out["long"] = await _post(s, f"{base}/chat/completions", _ask(content="hello " * 5000))
            out["finished"] = await _post(s, f"{done_base}/chat/completions", _ask())
            out["nowhere"] = await _post(s, f"{gw.url}/v1/chat/completions", _ask())
            out["ok"] = await _post(s, f"{base}/chat/completions", _ask(max_tokens=3))
            async with s.get(f"{base}/models") as r:
                out["models"] = (r.status, await r.json())
        await gw.stop()
        await trainer.rt.controller.aclose()
        return out, trace

    out, trace = asyncio.run(go())
    assert out["json"][0] == 400 and "not valid JSON" in out["json"][1]["error"]["message"]
    assert out["role"][0] == 400 and out["role"][1]["error"]["param"] == "messages[1].role"
    assert out["model"][0] == 404 and "agents: solver, checker" in out["model"][1]["error"]["message"]
    assert out["stream"][0] == 400 and out["stream"][1]["error"]["param"] == "stream"
    assert out["long"][0] == 400 and "context of 4096 tokens" in out["long"][1]["error"]["message"]
    assert out["finished"][0] == 409 and "has finished" in out["finished"][1]["error"]["message"]
    assert out["nowhere"][0] == 400 and "base URL masrl gave the episode" in out["nowhere"][1]["error"]["message"]
    status, body = out["ok"]
    assert status == 200 and body["object"] == "chat.completion" and body["usage"]["completion_tokens"] <= 3
    assert [m["id"] for m in out["models"][1]["data"]] == ["solver", "checker"]
    # only the request that was served is on the trace: rejected ones never became calls
    assert [c.agent for c in trace.calls] == ["checker"] and trace.calls[0].completion == body["choices"][0]["message"]["content"]


def test_a_key_guards_every_route(trainer):
    async def go():
        gw = Gateway(api_key="s3cret")
        await gw.start()
        _, ctx = _episode(trainer)
        _, base = gw.open(ctx)
        async with aiohttp.ClientSession() as s:
            bare = await _post(s, f"{base}/chat/completions", _ask())
            keyed = await _post(s, f"{base}/chat/completions", _ask(max_tokens=2),
                                headers={"Authorization": "Bearer s3cret"})
        await gw.stop()
        await trainer.rt.controller.aclose()
        return bare, keyed

    bare, keyed = asyncio.run(go())
    assert bare[0] == 401 and "Authorization: Bearer" in bare[1]["error"]["message"] and keyed[0] == 200


def test_a_client_that_disconnects_has_its_call_cancelled_and_others_are_served(trainer):
    async def go():
        gw = Gateway()
        await gw.start()
        trace, ctx = _episode(trainer)
        _, base = gw.open(ctx)
        async with aiohttp.ClientSession() as s:
            quitter = asyncio.ensure_future(_post(s, f"{base}/chat/completions", _ask("solver"),
                                                  timeout=aiohttp.ClientTimeout(total=0.2)))
            stayer = asyncio.ensure_future(_post(s, f"{base}/chat/completions", _ask("checker", max_tokens=4)))
            gone = await asyncio.gather(quitter, return_exceptions=True)
            kept = await stayer
            later = await _post(s, f"{base}/chat/completions", _ask("checker", max_tokens=4))
        await asyncio.sleep(0.5)
        await gw.stop()
        await trainer.rt.controller.aclose()
        return gone[0], kept, later, trace

    gone, kept, later, trace = asyncio.run(go())
    assert isinstance(gone, asyncio.TimeoutError)
    assert kept[0] == 200 and later[0] == 200
    assert [c.agent for c in trace.calls] == ["checker", "checker"]  # the solver's call never completed


def test_two_hundred_concurrent_clients_are_all_served_and_recorded(trainer):
    async def go():
        gw = Gateway()
        await gw.start()
        episodes = [_episode(trainer) for _ in range(20)]
        bases = [gw.open(ctx)[1] for _, ctx in episodes]
        batches0 = sum(b.stats.batches for b in trainer.rt.controller.batchers)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
            got = await asyncio.gather(*[_post(s, f"{bases[i % 20]}/chat/completions",
                                               _ask(content=f"What is {i} + 1?", max_tokens=3)) for i in range(200)])
        batches = sum(b.stats.batches for b in trainer.rt.controller.batchers) - batches0
        await gw.stop()
        await trainer.rt.controller.aclose()
        return got, episodes, batches, gw.served

    got, episodes, batches, served = asyncio.run(go())
    assert [s for s, _ in got] == [200] * 200 and served == 200
    assert sum(len(t.calls) for t, _ in episodes) == 200  # every completed call is on its trace
    assert batches < 200  # requests were batched together
    assert {c.call_id for t, _ in episodes for c in t.calls} == {b["id"].removeprefix("chatcmpl-") for _, b in got}


def test_tool_calls_come_back_in_openai_format():
    call = Call("c1", "t", "q", 0, "solver", "p", 0, [],
                completion='Let me look. <tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>')
    msg = chat_response(call, offered_tools=True)["choices"][0]
    assert msg["finish_reason"] == "tool_calls" and msg["message"]["content"] == "Let me look."
    tc = msg["message"]["tool_calls"][0]
    assert tc["type"] == "function" and tc["function"]["name"] == "search"
    assert json.loads(tc["function"]["arguments"]) == {"query": "x"}
    plain = chat_response(call, offered_tools=False)["choices"][0]
    assert plain["finish_reason"] == "stop" and "tool_calls" not in plain["message"]


def test_an_outside_team_trains_through_the_gateway_as_a_function_and_as_a_program(tmp_path):
    for mode, options in (("function", {"agent": "openai_team:run", "command": None}), ("program", {})):
        data = _data(tmp_path / mode, **options)
        tr, workers, before = prepared_trainer(data, tmp_path / mode)
        rec = asyncio.run(tr.train_step())
        traces = tr.last_traces
        assert rec["rollout"]["failed"] == 0 and len(traces) == 6
        assert all([c.agent for c in t.calls] == ["solver", "checker"] and t.calls[1].completion for t in traces)
        assert rec["policies"]["shared"]["n_seqs"] == 12  # both agents' calls trained, exact tokens from the worker
        assert workers["shared"].fingerprint("shared") != before["shared"]
        asyncio.run(tr.rt.controller.aclose())


def _failing(task, base_url):
    raise RuntimeError("the team's own bug")


def _hanging(task, base_url):
    time.sleep(5)
    return "1"


def test_an_outside_team_that_raises_or_hangs_is_dropped_and_stops_the_run(tmp_path):
    for name, options in (("raise", {"agent": "test_gateway:_failing", "command": None}),
                          ("hang", {"agent": "test_gateway:_hanging", "command": None, "timeout_s": 1})):
        data = _data(tmp_path / name, **options)
        tr = Trainer(load_config(data=data), run_dir=tmp_path / name)
        tr.prepare(resume=False)
        with pytest.raises(MasrlError, match="6 of 6 traces failed") as err:
            asyncio.run(tr.run())
        assert ("the team's own bug" if name == "raise" else "did not finish task") in str(err.value)


def test_a_conversation_that_continues_a_call_trains_on_the_ids_that_were_sampled(trainer):
    async def go():
        gw = Gateway()
        await gw.start()
        trace, ctx = _episode(trainer)
        _, base = gw.open(ctx)
        first = [{"role": "user", "content": "What is 3 + 4?"}]
        async with aiohttp.ClientSession() as s:
            _, a = await _post(s, f"{base}/chat/completions", {"model": "checker", "messages": first, "max_tokens": 8})
            said = a["choices"][0]["message"]["content"]
            more = first + [{"role": "assistant", "content": said}, {"role": "user", "content": "Sure?"}]
            _, b = await _post(s, f"{base}/chat/completions", {"model": "checker", "messages": more, "max_tokens": 4})
        await gw.stop()
        await trainer.rt.controller.aclose()
        return trace

    worker = trainer.rt.workers[0]
    continued = worker.sampler.prompts.stats["continued"]
    trace = asyncio.run(go())
    one, two = (worker.sampler.buffer[c.call_id] for c in trace.calls)
    assert two.prompt_ids[: len(one.prompt_ids) + len(one.completion_ids)] == one.prompt_ids + one.completion_ids
    assert worker.sampler.prompts.stats["continued"] == continued + 1


def _posting(task, base_url):
    """An outside agent that scores itself: one call, then its credit and the episode's outcome."""
    import urllib.request

    def post(path, body):
        req = urllib.request.Request(f"{base_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    out = post("/chat/completions", {"model": "checker", "messages": [{"role": "user", "content": task["question"]}]})
    assert post("/rewards", [{"id": out["id"], "reward": 0.25}, {"reward": 0.75}]) == {"accepted": 2}
    assert post("/answer", {"answer": "42"}) == {"accepted": 1}
    return "what the program returned"


def test_an_outside_agent_can_post_its_episodes_outcome_and_a_calls_credit(tmp_path):
    data = _data(tmp_path, agent="test_gateway:_posting", command=None, score="posted")
    data["rewards"] = [{"type": "outcome"}, {"type": "credit"}]
    tr, _, _ = prepared_trainer(data, tmp_path)
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == 0
    for t in tr.last_traces:
        (call,) = t.calls
        assert t.metrics["outcome"] == 0.75 and call.credit == 0.25 and t.final_answer == "42"  # the posted answer
        assert call.reward_parts == {"outcome": 0.75, "credit": 0.25}
    asyncio.run(tr.rt.controller.aclose())


def test_posted_rewards_are_checked_before_any_is_kept():
    from masrl.driver.serving.wire import BadRequest, post_rewards

    trace = Trace("t", "q", 0)
    trace.calls.append(Call("c1", "t", "q", 0, "solver", "p", 0, []))
    for bad, says in (([{"reward": "high"}], "must be a finite number"), ([{"reward": float("nan")}], "finite"),
                      ([{"reward": 1.0}, {"id": "chatcmpl-nope", "reward": 1.0}], "is not a completion")):
        with pytest.raises(BadRequest, match=says):
            post_rewards(trace, bad)
        assert "posted_outcome" not in trace.state  # nothing of a bad batch is kept
    assert post_rewards(trace, [{"id": "chatcmpl-c1", "reward": -1}]) == 1 and trace.calls[0].credit == -1.0


def test_a_programs_output_is_read_in_bounded_chunks_and_capped(tmp_path):
    """A program that writes megabytes: the answer is still its last line (only the tail is kept); past
    ``max_output_mb`` it is stopped and its trace fails, saying so."""
    noisy = ("import sys; sys.stderr.write('e' * (3 << 20)); sys.stdout.write('x\\n' * (2 << 20)); "
             "print('7'); sys.stdout.flush()")
    data = _data(tmp_path / "ok", command=["python", "-c", noisy])
    tr, _, _ = prepared_trainer(data, tmp_path / "ok")
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == 0 and {t.final_answer for t in tr.last_traces} == {"7"}
    asyncio.run(tr.rt.controller.aclose())
    data = _data(tmp_path / "cap", command=["python", "-c", noisy], max_output_mb=1)
    data["rollout"]["max_failed_fraction"] = 1.0
    tr, _, _ = prepared_trainer(data, tmp_path / "cap")
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == 6
    assert all("wrote more than 1 MB" in t.error for t in tr.last_traces), [t.error for t in tr.last_traces][:2]
    asyncio.run(tr.rt.controller.aclose())


def test_a_stopped_program_takes_the_processes_it_started_with_it(tmp_path):
    """A program whose child keeps writing to the inherited stdout: past the cap both are killed (the child
    too: it is in the program's session) and the step ends instead of waiting on a pipe that never closes."""
    marker = f"masrl-orphan-{tmp_path.name}"
    child = "import os, time\nwhile 1:\n    try: os.write(1, b'y' * 65536)\n    except OSError: time.sleep(0.1)\n"
    spawn = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}, '{marker}']); time.sleep(600)"
    data = _data(tmp_path, command=["python", "-c", spawn], max_output_mb=1)
    data["rollout"]["max_failed_fraction"] = 1.0
    tr, _, _ = prepared_trainer(data, tmp_path)
    t0 = time.monotonic()
    rec = asyncio.run(tr.train_step())
    assert rec["rollout"]["failed"] == 6 and time.monotonic() - t0 < 120
    assert all("wrote more than 1 MB" in t.error for t in tr.last_traces), [t.error for t in tr.last_traces][:2]
    asyncio.run(tr.rt.controller.aclose())
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline_has(p, marker)]
    assert not left, f"processes left running: {left}"


def _cmdline_has(proc_dir: Path, text: str) -> bool:
    try:
        return text in (proc_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
