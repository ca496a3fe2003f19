"""What `evenflow service install` writes: a systemd user unit (Linux), a launchd agent (macOS), the settings file."""
from __future__ import annotations

import os
import plistlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

UNIT_NAME = "evenflow.service"
LAUNCHD_LABEL = "io.evenflow.daemon"

ENV_TEMPLATE = """\
# Settings for the evenflow service, one VARIABLE=value per line (`evenflow serve --help` lists them all).
# Restart the service after a change: evenflow service install (or systemctl --user restart evenflow).
#
# Listen on the LAN (a key is then required: `evenflow key new` writes one the daemon reads by itself):
#EVENFLOW_HOST=0.0.0.0:11434
#EVENFLOW_ADVERTISE=1
#EVENFLOW_BACKEND=auto
#EVENFLOW_KEEP_ALIVE=5m
"""


@dataclass(frozen=True)
class ServicePaths:
    service_file: Path  # the unit or the plist
    env_file: Path
    log_file: Path | None  # launchd only: systemd sends output to the journal


def evenflow_command() -> list[str]:
    """The evenflow actually running this command, as an absolute command line."""
    sibling = Path(sys.executable).parent / "evenflow"  # a venv's / pipx's console script
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return [str(sibling.absolute())]
    found = shutil.which("evenflow")
    if found:
        return [os.path.abspath(found)]  # not resolved: pipx's ~/.local/bin link survives upgrades
    return [sys.executable, "-m", "evenflow.clients.cli"]


def service_paths(platform: str | None = None, home: Path | None = None) -> ServicePaths:
    import platformdirs  # noqa: PLC0415 - only the service verbs need it

    platform = platform or sys.platform
    home = home or Path.home()
    env_file = Path(platformdirs.user_config_dir("evenflow")) / "evenflow.env"
    if platform == "darwin":
        return ServicePaths(home / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist", env_file,
                            home / "Library" / "Logs" / "evenflow" / "evenflow.log")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")  # where systemd looks for user units
    return ServicePaths(config / "systemd" / "user" / UNIT_NAME, env_file, None)


def _systemd_word(arg: str) -> str:
    """One ExecStart word: specifiers (%) escaped, quoted when it holds spaces or quotes."""
    arg = arg.replace("%", "%%")
    if any(c in arg for c in ' \t"\'\\;$'):
        return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return arg


def render_unit(command: list[str], env_file: Path) -> str:
    exec_start = " ".join(_systemd_word(a) for a in [*command, "serve"])
    return f"""\
# Written by `evenflow service install`; remove with `evenflow service uninstall`.
# Settings: {env_file}   Logs: journalctl --user -u evenflow
# To keep it running while you are logged out: loginctl enable-linger $USER
[Unit]
Description=evenflow local LLM inference daemon (Ollama-compatible API)
Documentation=https://github.com/ollama/ollama/blob/main/docs/api.md
After=network-online.target
Wants=network-online.target

[Service]
Type=exec
EnvironmentFile=-{_systemd_word(str(env_file))}
Environment=PYTHONUNBUFFERED=1
ExecStart={exec_start}
Restart=on-failure
RestartSec=3
KillSignal=SIGTERM
TimeoutStopSec=20

[Install]
WantedBy=default.target
"""


# launchd has no environment-file option: a tiny sh wrapper exports the file's variables, then execs evenflow.
_LAUNCHD_WRAPPER = 'set -a; if [ -r "$1" ]; then . "$1"; fi; set +a; shift; exec "$@"'


def render_plist(command: list[str], env_file: Path, log_file: Path) -> bytes:
    return plistlib.dumps({
        "Label": LAUNCHD_LABEL,
        "ProgramArguments": ["/bin/sh", "-c", _LAUNCHD_WRAPPER, "evenflow-service", str(env_file), *command, "serve"],
        "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restart on failure, not after a clean stop
        "ThrottleInterval": 3,
        "StandardOutPath": str(log_file),
        "StandardErrorPath": str(log_file),
    })


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=value lines (comments and blanks skipped, surrounding quotes removed), as systemd reads them."""
    out: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return out
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("#", ";")) or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        out[k.strip().removeprefix("export ").strip()] = v
    return out
