"""What the `evenflow` client verbs share (cli.py, run.py, repl.py, transfer.py): the HTTP client to the daemon,
`check` for its answers, CLIError, and `show`'s summary."""
from __future__ import annotations

from typing import Any

import httpx

from ..link import connect


class CLIError(Exception):
    """A verb failed; main() prints the message (already `Error: ...`) and exits 1."""


def daemon_client() -> httpx.Client:
    """A client to EVENFLOW_HOST / OLLAMA_HOST (`auto` finds a daemon on the LAN), with the API key if there is one."""
    return httpx.Client(base_url=connect.base_url(), headers=connect.auth_headers(),
                        timeout=httpx.Timeout(None, connect=5.0))


def check(r: httpx.Response) -> httpx.Response:
    """`r`, unless the daemon answered an error: then CLIError with its `{"error": ...}` message."""
    if r.status_code >= 400:
        try:
            msg = r.json().get("error", r.text)
        except (ValueError, AttributeError):
            msg = r.text
        raise CLIError(f"Error: {msg}")
    return r


def print_show_info(info: dict[str, Any]) -> None:
    """`ollama show`'s summary: model, capabilities, parameters."""
    d = info.get("details", {})
    print("  Model")
    for k, v in (("architecture", d.get("family")), ("parameters", d.get("parameter_size")),
                 ("context length", info.get("model_info", {}).get(f"{d.get('family')}.context_length")),
                 ("quantization", d.get("quantization_level"))):
        print(f"    {k:<20}{v}")
    if info.get("capabilities"):
        print("\n  Capabilities")
        for cap in info["capabilities"]:
            print(f"    {cap}")
    if info.get("parameters"):
        print("\n  Parameters")
        for line in info["parameters"].splitlines():
            print(f"    {line}")
