"""The monitor's async HTTP client: the `/api/events` feed, `/api/ps`, `/metrics`, `/api/tags` and streamed chats."""
from __future__ import annotations

import json
import re
from typing import Any, AsyncIterator

import httpx

from ..link.connect import auth_headers

_METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")
NEED_KEY = ("the daemon requires an API key: set EVENFLOW_API_KEY, or put the key in the key file "
            "(`evenflow key path` shows where)")


class DaemonError(Exception):
    """The daemon answered with an error (its `{"error": ...}` message) or an unexpected body."""


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {name: value}, summed over label sets (the monitor shows totals across models)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line.strip())
        if m and not line.startswith("#"):
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                continue
    return out


def _error_of(r: httpx.Response) -> str:
    if r.status_code == 401:
        return NEED_KEY
    try:
        return str(r.json().get("error", r.text))
    except (ValueError, AttributeError):
        return r.text or f"HTTP {r.status_code}"


class Feed:
    """One httpx.AsyncClient to a daemon; every call is async so nothing blocks the UI loop."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url
        # No read timeout on the streams: /api/events sends a heartbeat every 15 s, chats may think for a while.
        self.client = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(timeout, read=None),
                                        headers=auth_headers())

    async def aclose(self) -> None:
        await self.client.aclose()

    async def events(self) -> AsyncIterator[dict[str, Any]]:
        """The `/api/events` lines as dicts, until the daemon closes the feed (raises httpx errors on failure)."""
        async with self.client.stream("GET", "/api/events") as r:
            if r.status_code != 200:
                await r.aread()
                raise DaemonError(f"/api/events answered {r.status_code}: {_error_of(r)}")
            async for line in r.aiter_lines():
                if line.strip():
                    yield json.loads(line)

    async def _get_json(self, path: str) -> Any:
        r = await self.client.get(path)
        if r.status_code != 200:
            raise DaemonError(f"{path} answered {r.status_code}: {_error_of(r)}")
        return r.json()

    async def ps(self) -> list[dict[str, Any]]:
        return list((await self._get_json("/api/ps")).get("models", []))

    async def tags(self) -> list[str]:
        return [m["name"] for m in (await self._get_json("/api/tags")).get("models", [])]

    async def metrics(self) -> dict[str, float]:
        r = await self.client.get("/metrics")
        if r.status_code != 200:
            raise DaemonError(f"/metrics answered {r.status_code}: {_error_of(r)}")
        return parse_metrics(r.text)

    async def stream(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """POST a streamed /api/chat or /api/generate; yields its NDJSON parts. Closing it aborts the request."""
        async with self.client.stream("POST", path, json={**body, "stream": True}) as r:
            if r.status_code != 200:
                await r.aread()
                raise DaemonError(_error_of(r))
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                part = json.loads(line)
                if part.get("error"):
                    raise DaemonError(str(part["error"]))
                yield part
