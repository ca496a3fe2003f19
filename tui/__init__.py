"""The Textual monitor and chat (`evenflow monitor`, `python -m evenflow.tui`) and `evenflow demo`."""
from __future__ import annotations

import sys

from ..link.connect import base_url  # the TUI's hosts resolve as the CLI's


def run_monitor(host: str | None = None, discover: bool = False) -> None:
    """Open the monitor on the daemon at `host` (else EVENFLOW_HOST / OLLAMA_HOST / 127.0.0.1:11434).

    `discover` (or host `auto`): the first daemon zeroconf finds on the LAN; DiscoveryError when none answers."""
    from .app import EvenflowApp  # noqa: PLC0415 - textual loads only when the TUI runs

    EvenflowApp(base_url("auto" if discover else host)).run()


def run_demo(host: str | None = None) -> None:
    """`evenflow demo`: the daemon at `host` (started here if none answers), a scripted workload, the monitor."""
    from .demo import DemoError, run_demo as demo  # noqa: PLC0415 - httpx only for the demo

    try:
        demo(base_url(host))
    except DemoError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)
