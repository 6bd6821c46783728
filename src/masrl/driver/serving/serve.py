"""``masrl serve CONFIG [--checkpoint RUN]``: a config's agents behind the OpenAI-compatible gateway.

For evaluation or use after training: every request names an agent (``model``) and is answered by
that agent's policy (a checkpoint's weights with ``--checkpoint``), batched with the other requests
in flight. Nothing is trained and nothing is kept: each request gets a context of its own. Unlike
training, a request's ``temperature`` is honoured (``max_tokens`` and ``stop`` as in training).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from masrl.config import RunConfig
from masrl.driver.builder import build_runtime
from masrl.driver.checks import check_run
from masrl.driver.rollout.context import WorkflowContext
from masrl.driver.run import rundir as ckpt
from masrl.driver.serving.gateway import Gateway
from masrl.errors import ConfigError
from masrl.trace import Trace, new_id
from masrl.web import server as web


def serve(cfg: RunConfig, *, checkpoint: str | None = None, host: str = "127.0.0.1", port: int = 8000,
          api_key_env: str | None = None, log=print, ready=None, limits: web.ServerLimits | None = None) -> None:
    """Check the config, take the port, then load the models and answer until stopped: a bad config
    or a port in use is a one-line error before any model loads."""
    path = ckpt.resolve_checkpoint(checkpoint) if checkpoint else None
    if path is not None:
        ckpt.check_fits(path, cfg, fix="serve the run as it was trained: masrl serve RUN")
    key = None
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ConfigError(f"--api-key-env {api_key_env}: ${api_key_env} is not set")
    if key is None and not web.loopback_host(host):
        raise ConfigError(f"--host {host}: a server other machines can reach needs a key; set --api-key-env VAR "
                          f"(without one it answers only requests to 127.0.0.1 or localhost)")
    plan = check_run(cfg)
    sock = web.bind(host, port)
    try:
        rt = build_runtime(cfg, log=log, plan=plan)
    except BaseException:
        sock.close()
        raise
    try:
        if path is not None:
            for w in rt.workers:
                w.load(str(path), with_optimizer=False)
            log(f"[masrl] serving the weights of {path}")
        asyncio.run(_gateway(cfg, rt, host, sock, key, log, ready, limits))
    finally:
        rt.close()


async def _gateway(cfg: RunConfig, rt, host: str, sock, key: str | None, log, ready, limits) -> None:
    """The gateway over the runtime `rt` built from `cfg`, answering until stopped."""
    def context():
        trace = Trace(trace_id=new_id("serve"), task_id="serve", sample_idx=0)
        return WorkflowContext(trace, rt.agents, rt.controller.submit, train=False,
                               call_timeout_s=cfg.rollout.call_timeout_s)

    gw = Gateway(host=host, api_key=key, free_context=context, sock=sock, limits=limits)
    url = await gw.start()
    if not web.loopback_host(host):
        log(f"[masrl] listening on {host}, reachable from other machines (requests need the API key)")
    log(f"[masrl] serving agents {', '.join(rt.agents)} at {url}/v1 (OpenAI-compatible; model = agent); Ctrl-C to stop")
    if ready is not None:
        Path(ready).write_text(url)
    try:
        await asyncio.Event().wait()
    finally:
        await gw.stop()
        await rt.controller.aclose()
