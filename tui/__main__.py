"""`python -m evenflow.tui [--host URL]`: the monitor."""
from __future__ import annotations

import argparse

from . import run_monitor


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m evenflow.tui", description="Watch an evenflow daemon live")
    p.add_argument("--host", default=None, help="daemon address (default: EVENFLOW_HOST / OLLAMA_HOST / 127.0.0.1:11434)")
    run_monitor(p.parse_args(argv).host)


if __name__ == "__main__":
    main()
