"""POST a chat completion to an OpenAI-compatible server, with retries (the served-policy host
and the judge reward both use it). Failures after the retries are ``InfraError``."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request

from masrl.errors import ConfigError, InfraError

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def post_chat(url: str, headers: dict, body: dict, *, timeout_s: float, retries: int, backoff_s: float,
              stats: dict | None = None) -> dict:
    """POST one chat completion; retry connection errors, timeouts, 408/409/429/5xx with doubling
    waits. Returns the parsed JSON; raises ``InfraError`` (naming the URL, model and last error)."""
    stats = stats if stats is not None else {}
    for k in ("requests", "retries", "failures"):
        stats.setdefault(k, 0)
    data = json.dumps(body).encode()
    last = ""
    attempt = 0
    for attempt in range(retries + 1):
        if attempt:
            stats["retries"] += 1
            time.sleep(backoff_s * 2 ** (attempt - 1))
        stats["requests"] += 1
        req = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}: {exc.read()[:300].decode(errors='replace')}"
            if exc.code not in RETRY_STATUS:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        except ValueError as exc:
            last = f"unreadable response ({exc})"
            break
    stats["failures"] += 1
    raise InfraError(f"{url} (model {body.get('model')!r}): {last} after {attempt + 1} attempt(s)")


def auth_headers(api_key_env: str | None, where: str) -> dict:
    headers = {"Content-Type": "application/json"}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ConfigError(f"{where}.api_key_env: ${api_key_env} is not set")
        headers["Authorization"] = f"Bearer {key}"
    return headers
