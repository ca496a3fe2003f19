"""Where a client connects and with which key: the one place the CLI, the TUI and `evenflow bench` ask.

`base_url(host)`: host (or EVENFLOW_HOST / OLLAMA_HOST) as a URL, `auto` = the first daemon zeroconf finds.
`auth_headers()`: `Authorization: Bearer <key>` from EVENFLOW_API_KEY or the key file, `{}` when there is none.
"""
from __future__ import annotations

import os

from ..daemon.apikey import default_key_file, read_key_file
from ..daemon.settings import parse_host

DEFAULT_HOST = "127.0.0.1:11434"


def api_key() -> str | None:
    """EVENFLOW_API_KEY, else the key file's key (`evenflow key new`), else None."""
    key = os.environ.get("EVENFLOW_API_KEY", "").strip()
    return key or read_key_file(default_key_file())


def auth_headers(key: str | None = None) -> dict[str, str]:
    key = key or api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def host_setting() -> str:
    return (os.environ.get("EVENFLOW_HOST") or os.environ.get("OLLAMA_HOST") or "").strip() or DEFAULT_HOST


def base_url(host: str | None = None, discover_timeout: float = 3.0) -> str:
    """A URL for `host` (None = the environment's); `auto` browses the LAN and takes the first daemon."""
    raw = (host or "").strip() or host_setting()
    if raw.lower() == "auto":
        from .discover import first_daemon  # noqa: PLC0415 - the LAN browser (asyncio, zeroconf) only for `auto`

        return first_daemon(discover_timeout).url
    hp = parse_host(raw)
    h = "127.0.0.1" if hp.host in ("0.0.0.0", "::") else hp.host  # a wildcard bind is reached on loopback
    return f"{hp.scheme}://{'[' + h + ']' if ':' in h else h}:{hp.port}"
