"""`python -m evenflow.tui [--host URL]`: the monitor."""
from __future__ import annotations

import argparse
import sys

from ..link.discover import DiscoveryError
from . import run_monitor


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m evenflow.tui", description="Watch an evenflow daemon live")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--host", default=None,
                       help="daemon address (default: EVENFLOW_HOST / OLLAMA_HOST / 127.0.0.1:11434)")
    where.add_argument("--discover", action="store_true", help="the first daemon found on the LAN (zeroconf)")
    args = p.parse_args(argv)
    try:
        run_monitor(args.host, discover=args.discover)
    except DiscoveryError as e:
        sys.exit(f"Error: {e}")


if __name__ == "__main__":
    main()
