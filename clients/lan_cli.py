"""`evenflow key new|show|path` and `evenflow discover`: the API key file and the LAN browser on the command line."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ..daemon.apikey import default_key_file, new_key, read_key_file, write_key_file
from ..link.discover import DiscoveryError, discover


def cmd_key_new(args: argparse.Namespace) -> None:
    path = default_key_file()
    key = new_key()
    try:
        write_key_file(path, key, overwrite=args.force)
    except FileExistsError as e:
        sys.exit(f"Error: {e}")
    print(key)
    print(f"saved to {path} (mode 0600). The daemon and the CLI on this machine read it by themselves; on another "
          "machine set EVENFLOW_API_KEY to it, or send `Authorization: Bearer <key>`. Restart a running daemon.",
          file=sys.stderr)


def cmd_key_show(args: argparse.Namespace) -> None:
    path = default_key_file()
    try:
        key = read_key_file(path)
    except ValueError as e:
        sys.exit(f"Error: {e}")
    if key is None:
        sys.exit(f"Error: no key file at {path} (create one with `evenflow key new`)")
    print(key)


def cmd_key_path(args: argparse.Namespace) -> None:
    print(default_key_file())


def cmd_discover(args: argparse.Namespace) -> None:
    interfaces = [a.strip() for a in args.interfaces.split(",") if a.strip()] if args.interfaces else None
    try:
        found = discover(args.timeout, interfaces)
    except (ValueError, OSError, DiscoveryError) as e:
        sys.exit(f"Error: {e}")
    if args.json:
        print(json.dumps([asdict(f) | {"url": f.url} for f in found], indent=2))
        return
    if not found:
        print(f"no daemon answered within {args.timeout:g} s", file=sys.stderr)
        sys.exit(1)
    rows = [["NAME", "URL", "VERSION", "AUTH", "MODELS"]]
    for f in found:
        more = f" (+{f.models_total - len(f.models)} more)" if f.models_total > len(f.models) else ""
        rows.append([f.name, f.url, f.version, "key" if f.auth else "open", ",".join(f.models) + more])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\n".join("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows))


def add_parsers(sub: argparse._SubParsersAction) -> None:
    k = sub.add_parser("key", help="the API key file (`key new` creates one the daemon then requires)")
    ks = k.add_subparsers(dest="key_command", required=True)
    kn = ks.add_parser("new", help="create a random key in the key file (mode 0600) and print it")
    kn.add_argument("--force", action="store_true", help="replace an existing key")
    kn.set_defaults(func=cmd_key_new)
    ks.add_parser("show", help="print the key").set_defaults(func=cmd_key_show)
    ks.add_parser("path", help="print the key file's path").set_defaults(func=cmd_key_path)
    d = sub.add_parser("discover", help="list evenflow/ollama daemons advertised on the LAN (zeroconf)")
    d.add_argument("--timeout", type=float, default=3.0, help="seconds to listen (default 3)")
    d.add_argument("--interfaces", default=None, help="comma-separated addresses to browse on (default: all; "
                                                      "$EVENFLOW_DISCOVER_INTERFACES)")
    d.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_discover)
