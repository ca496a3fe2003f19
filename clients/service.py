"""`evenflow service install|uninstall|status|logs`: run the installed evenflow as a systemd user service / launchd agent."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

import httpx

from ..link.connect import base_url
from .service_files import (ENV_TEMPLATE, LAUNCHD_LABEL, UNIT_NAME, ServicePaths, evenflow_command, read_env_file,
                            render_plist, render_unit, service_paths)


def _fail(msg: str) -> None:
    sys.exit(f"Error: {msg}")


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except FileNotFoundError:
        _fail(f"{cmd[0]} not found: is this a systemd (Linux) or launchd (macOS) system?")
    if check and r.returncode != 0:
        _fail(f"`{' '.join(cmd)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def _macos() -> bool:
    return sys.platform == "darwin"


def _launchd_domain() -> str:
    return f"gui/{os.getuid()}"


def cmd_install(args: argparse.Namespace) -> None:
    paths = service_paths()
    command = evenflow_command()
    if not paths.env_file.exists():
        paths.env_file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(paths.env_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # may come to hold a key
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(ENV_TEMPLATE)
    paths.service_file.parent.mkdir(parents=True, exist_ok=True)
    if _macos():
        assert paths.log_file is not None
        paths.log_file.parent.mkdir(parents=True, exist_ok=True)
        paths.service_file.write_bytes(render_plist(command, paths.env_file, paths.log_file))
    else:
        paths.service_file.write_text(render_unit(command, paths.env_file), encoding="utf-8")
    print(f"wrote {paths.service_file}\n  runs:     {' '.join(command)} serve\n  settings: {paths.env_file}")
    if args.no_start:
        how = (f"launchctl bootstrap {_launchd_domain()} {paths.service_file}" if _macos()
               else "systemctl --user daemon-reload && systemctl --user enable --now evenflow")
        print(f"not started (--no-start); start it with: {how}")
        return
    if _macos():
        _run(["launchctl", "bootout", f"{_launchd_domain()}/{LAUNCHD_LABEL}"], check=False)  # a previous install
        _run(["launchctl", "bootstrap", _launchd_domain(), str(paths.service_file)])
        print(f"started; logs: evenflow service logs ({paths.log_file})")
    else:
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "enable", UNIT_NAME])
        _run(["systemctl", "--user", "restart", UNIT_NAME])  # restart: picks up a changed unit or settings file
        print("started; logs: evenflow service logs (journalctl --user -u evenflow)\n"
              "to keep it running while you are logged out: loginctl enable-linger $USER")


def cmd_uninstall(args: argparse.Namespace) -> None:
    paths = service_paths()
    if not paths.service_file.exists():
        _fail(f"no evenflow service installed ({paths.service_file} does not exist)")
    if not args.no_stop:
        if _macos():
            _run(["launchctl", "bootout", f"{_launchd_domain()}/{LAUNCHD_LABEL}"], check=False)
        else:
            _run(["systemctl", "--user", "disable", "--now", UNIT_NAME], check=False)
    paths.service_file.unlink()
    if not args.no_stop and not _macos():
        _run(["systemctl", "--user", "daemon-reload"], check=False)
    print(f"removed {paths.service_file} (settings kept in {paths.env_file})")


def manager_state(paths: ServicePaths) -> str:
    """What systemd/launchd says: active, inactive, failed, ... or why it cannot be asked."""
    cmd = (["launchctl", "print", f"{_launchd_domain()}/{LAUNCHD_LABEL}"] if _macos()
           else ["systemctl", "--user", "is-active", UNIT_NAME])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired) as e:
        return f"unknown ({cmd[0]}: {e})"
    if _macos():
        state = next((ln.split("=", 1)[1].strip() for ln in r.stdout.splitlines() if ln.strip().startswith("state =")),
                     None)
        return state or ("not loaded" if r.returncode else "loaded")
    out = r.stdout.strip()
    return out if out and "\n" not in out else f"unknown ({(r.stderr or r.stdout).strip() or r.returncode})"


def service_url(paths: ServicePaths) -> str:
    env = read_env_file(paths.env_file)
    return base_url(env.get("EVENFLOW_HOST") or env.get("OLLAMA_HOST") or "127.0.0.1:11434")


def cmd_status(args: argparse.Namespace) -> None:
    paths = service_paths()
    installed = paths.service_file.exists()
    print(f"service file: {paths.service_file} ({'installed' if installed else 'not installed'})")
    state = manager_state(paths) if installed else "not installed"
    print(f"state:        {state}")
    url = service_url(paths)
    try:
        r = httpx.get(url + "/", timeout=3.0, trust_env=False)  # GET / needs no key
        answers = r.status_code == 200
        print(f"answers:      {'yes' if answers else 'no'} at {url} ({r.status_code} {r.text.strip()[:60]})")
    except httpx.HTTPError as e:
        answers = False
        print(f"answers:      no, nothing at {url} ({type(e).__name__})")
    sys.exit(0 if answers and state in ("active", "running") else 3)  # 3: systemctl's "not running"


def cmd_logs(args: argparse.Namespace) -> None:
    paths = service_paths()
    if _macos():
        assert paths.log_file is not None
        cmd = ["tail", "-n", str(args.lines)] + (["-f"] if args.follow else []) + [str(paths.log_file)]
    else:
        cmd = ["journalctl", "--user", "-u", UNIT_NAME, "-n", str(args.lines)] + (["-f"] if args.follow else [])
    try:
        os.execvp(cmd[0], cmd)
    except FileNotFoundError:
        _fail(f"{cmd[0]} not found")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("service", help="install evenflow as a user service (systemd on Linux, launchd on macOS)",
                       description="Run the evenflow installed here as a per-user service that restarts on failure. "
                                   "Settings go in the environment file it prints (VARIABLE=value lines).")
    ss = p.add_subparsers(dest="service_command", required=True)
    i = ss.add_parser("install", help="write the unit/agent and start it")
    i.add_argument("--no-start", action="store_true", help="only write the files")
    i.set_defaults(func=cmd_install)
    u = ss.add_parser("uninstall", help="stop it and remove the unit/agent (the settings file stays)")
    u.add_argument("--no-stop", action="store_true", help="only remove the file")
    u.set_defaults(func=cmd_uninstall)
    ss.add_parser("status", help="is it installed, running, answering").set_defaults(func=cmd_status)
    lg = ss.add_parser("logs", help="its log (journalctl --user / the launchd log file)")
    lg.add_argument("-n", "--lines", type=int, default=100)
    lg.add_argument("-f", "--follow", action="store_true")
    lg.set_defaults(func=cmd_logs)
