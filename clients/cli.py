"""The `evenflow` console script: `serve` (every setting a flag), and list/ps/show/rm/cp/stop over HTTP (run: run.py,
session.py, repl.py; pull/push/create: transfer.py; key/discover: lan_cli.py; monitor/demo: tui/)."""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from datetime import datetime, timezone

import httpx

from .. import __version__, tui
from ..daemon.settings import SETTINGS, ConfigError, load_settings
from ..link import connect
from ..link.discover import DiscoveryError
from . import lan_cli, run, service, transfer
from .common import CLIError, check, daemon_client, print_show_info


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def _parse_time(ts: str) -> datetime:
    """RFC3339 with any number of fractional digits (Go writes 9) -> aware datetime."""
    return datetime.fromisoformat(re.sub(r"\.\d+", "", ts).replace("Z", "+00:00"))


def _ago(ts: str) -> str:
    try:
        dt = _parse_time(ts)
    except ValueError:
        return ts
    secs = (datetime.now(timezone.utc) - dt).total_seconds()
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if abs(secs) >= n:
            v = int(abs(secs) // n)
            return f"{v} {unit}{'s' if v != 1 else ''} {'ago' if secs > 0 else 'from now'}"
    return "less than a minute ago" if secs > 0 else "less than a minute from now"


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def cmd_list(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        models = check(c.get("/api/tags")).json()["models"]
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    rows += [[m["name"], m["digest"][:12], _size(m["size"]), _ago(m["modified_at"])] for m in models]
    print(_table(rows))


def cmd_ps(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        body = check(c.get("/api/ps")).json()
    models = body["models"]
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]]
    for m in models:
        vram, size = m.get("size_vram", 0), m.get("size", 0)
        proc = "100% GPU" if size and vram == size else "100% CPU" if vram == 0 else f"{vram * 100 // size}% GPU"
        try:
            far = _parse_time(m["expires_at"]).year > datetime.now().year + 20
        except ValueError:
            far = False
        until = "Forever" if far else _ago(m["expires_at"])
        ctx, pool = str(m.get("context_length", "")), m.get("kv_pool") or {}
        if pool.get("max_context", 0) > (m.get("context_length") or 0):  # a request's num_ctx up to it: no reload
            ctx += f" (up to {pool['max_context']})"
        rows.append([m["name"], m["digest"][:12], _size(size), proc, ctx, until])
    print(_table(rows))
    disk = body.get("kv_cache")
    if disk and disk.get("entries"):
        n = disk["entries"]
        print(f"\nKV disk cache: {_size(disk['size'])} in {n} saved prefix{'es' if n != 1 else ''} ({disk['path']})")


def cmd_show(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        info = check(c.post("/api/show", json={"model": args.model})).json()
    for part in ("modelfile", "template", "system", "license", "parameters"):
        if getattr(args, part):
            print(info.get(part, ""))
            return
    print_show_info(info)


def cmd_rm(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        for name in args.models:
            c.post("/api/generate", json={"model": name, "keep_alive": 0, "stream": False})  # unload first
            check(c.request("DELETE", "/api/delete", json={"model": name}))
            print(f"deleted '{name}'")


def cmd_cp(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        check(c.post("/api/copy", json={"source": args.source, "destination": args.destination}))
    print(f"copied '{args.source}' to '{args.destination}'")


def cmd_stop(args: argparse.Namespace) -> None:
    with daemon_client() as c:
        check(c.post("/api/generate", json={"model": args.model, "keep_alive": 0, "stream": False}))


def cmd_version(args: argparse.Namespace) -> None:
    """Ollama's `-v`: the server's version, and the client's when they differ or no server answers."""
    try:
        with daemon_client() as c:
            server = check(c.get("/api/version")).json()
    except httpx.HTTPError:
        print("Warning: could not connect to a running evenflow instance")
        print(f"Warning: client version is {__version__}")
        return
    print(f"evenflow version is {server.get('evenflow', '?')} (Ollama API {server.get('version', '?')})")
    if server.get("evenflow") != __version__:
        print(f"Warning: client version is {__version__}")


def cmd_serve(args: argparse.Namespace) -> None:
    if args.check:
        _check()
        return
    from ..daemon.server import ServeError, serve  # noqa: PLC0415 - keeps the client commands light

    overrides = {}
    for spec in SETTINGS:
        v = getattr(args, spec.name)
        if v is not None and v is not False:
            overrides[spec.name] = "1" if v is True else v
    settings = load_settings(overrides=overrides)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(settings, log_level="debug" if args.debug else "info")
    except ServeError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)


def _check() -> None:
    """`serve --check`: what the daemon would use on this machine; exit 1 when something needs fixing."""
    from ..backends.gpu_report import gather  # noqa: PLC0415 - llama.cpp and torch only for this verb

    report = gather()
    print("\n".join(report.lines()))
    sys.exit(1 if report.warnings else 0)


def cmd_tui(args: argparse.Namespace) -> None:
    if args.command == "monitor":
        tui.run_monitor(args.host, discover=args.discover)
    else:
        tui.run_demo(args.host)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evenflow", description="Local LLM inference daemon (Ollama-compatible)")
    p.add_argument("-v", "--version", action="store_true", help="show the client and server versions")
    sub = p.add_subparsers(dest="command")
    s = sub.add_parser("serve", aliases=["start"], help="start the daemon",
                       description="Start the daemon. Every flag has an environment variable (shown in brackets); "
                                   "the flag wins, then the EVENFLOW_ variable, then the OLLAMA_ one.")
    for spec in SETTINGS:
        flag = "--" + spec.name.replace("_", "-")
        h = f"{spec.help} [{' / '.join(spec.envs)}; {spec.accepts}]"
        if spec.is_flag:
            s.add_argument(flag, action="store_true", default=False, help=h)
        else:
            s.add_argument(flag, default=None, metavar="VALUE", help=h)
    s.add_argument("--debug", action="store_true", help="debug logging")
    s.add_argument("--check", action="store_true",
                   help="print the llama.cpp build, the devices it sees, torch/MLX and what `auto` picks, then exit "
                        "(1 when something needs fixing, e.g. an NVIDIA GPU with a CPU-only llama.cpp)")
    s.set_defaults(func=cmd_serve)
    sub.add_parser("list", aliases=["ls"], help="list models").set_defaults(func=cmd_list)
    sub.add_parser("ps", help="list loaded models").set_defaults(func=cmd_ps)
    sh = sub.add_parser("show", help="show a model")
    sh.add_argument("model")
    for part in ("modelfile", "template", "system", "license", "parameters"):
        sh.add_argument(f"--{part}", action="store_true", help=f"print only the {part}")
    sh.set_defaults(func=cmd_show)
    rm = sub.add_parser("rm", help="delete models")
    rm.add_argument("models", nargs="+")
    rm.set_defaults(func=cmd_rm)
    cp = sub.add_parser("cp", help="copy a model")
    cp.add_argument("source")
    cp.add_argument("destination")
    cp.set_defaults(func=cmd_cp)
    run.add_parser(sub)
    transfer.add_parsers(sub)
    st = sub.add_parser("stop", help="unload a model")
    st.add_argument("model")
    st.set_defaults(func=cmd_stop)
    for name, what in (("monitor", "watch a daemon live, and chat (Textual TUI)"),
                       ("demo", "start a daemon unless one runs, run a scripted workload, open the monitor")):
        t = sub.add_parser(name, help=what)
        where = t.add_mutually_exclusive_group()
        where.add_argument("--host", default=None, help="daemon address (default: EVENFLOW_HOST / OLLAMA_HOST)")
        if name == "monitor":
            where.add_argument("--discover", action="store_true", help="the first daemon found on the LAN (zeroconf)")
        t.set_defaults(func=cmd_tui)
    sub.add_parser("bench", help="load generator: stall / poisson / sweep against any server (see `evenflow bench -h`)",
                   add_help=False)
    lan_cli.add_parsers(sub)  # key, discover (issue 15)
    service.add_parser(sub)
    for name in CLIENT_COMMANDS:  # every client verb can aim at another daemon, `auto` = one found on the LAN
        if name in sub.choices:
            sub.choices[name].add_argument("--host", default=None, help="daemon to talk to (host:port, URL or "
                                           "`auto`; default $EVENFLOW_HOST / $OLLAMA_HOST / 127.0.0.1:11434)")
    return p


CLIENT_COMMANDS = ("run", "list", "ps", "show", "rm", "cp", "stop", "pull", "push", "create")


def _pin_host(args: argparse.Namespace) -> None:
    """Resolve --host / EVENFLOW_HOST once (an `auto` browse is seconds) so every request goes to the same daemon."""
    if args.command in ("serve", "start"):
        return
    host = getattr(args, "host", None) or connect.host_setting()
    if getattr(args, "host", None) or host.lower() == "auto":
        os.environ["EVENFLOW_HOST"] = connect.base_url(host)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":  # its own parser, with its own subcommands
        from .bench_cli import main as bench_main  # noqa: PLC0415 - rich/matplotlib only when benchmarking

        sys.exit(bench_main(argv[1:]))
    if argv and argv[0] == "run":  # Ollama's flag grammar: a bare --think never eats the prompt's first word
        try:
            argv = ["run", *run.ollama_argv(argv[1:])]
        except CLIError as e:
            print(str(e), file=sys.stderr)
            sys.exit(1)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        args.func = cmd_version
    elif args.command is None:
        parser.print_help(sys.stderr)
        sys.exit(2)
    try:
        _pin_host(args)
        args.func(args)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(2)
    except CLIError as e:
        print(str(e), file=sys.stderr)
        sys.exit(1)
    except (DiscoveryError, ValueError) as e:  # EVENFLOW_HOST=auto found nothing; a bad key file or host
        print(f"Error: {e}", file=sys.stderr)
        sys.exit(1)
    except httpx.ConnectError as e:
        print(f"Error: could not connect to evenflow at {e.request.url.copy_with(path='/')}; is `evenflow serve` "
              "running?", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
