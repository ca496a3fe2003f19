"""`evenflow service`: the generated systemd unit and launchd plist, written under a temporary HOME (never the real
user's services: --no-start, no user bus), checked by systemd-analyze where it exists, and `status` against a daemon."""
from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from api_harness import start_daemon
from evenflow.clients.service_files import evenflow_command, read_env_file, render_plist, render_unit


def _env(home: Path) -> dict[str, str]:
    # XDG_RUNTIME_DIR/DBUS pointing nowhere: systemctl --user cannot reach a real user manager from these tests.
    return os.environ | {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "cfg"), "XDG_RUNTIME_DIR": str(home / "run"),
                         "DBUS_SESSION_BUS_ADDRESS": f"unix:path={home / 'run' / 'bus'}"}


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "service", *args], capture_output=True,
                          text=True, env=_env(home), timeout=120)


def test_unit_contents_and_quoting(tmp_path: Path) -> None:
    unit = render_unit(["/opt/my tools/bin/evenflow"], tmp_path / "100% cfg" / "evenflow.env")
    assert 'ExecStart="/opt/my tools/bin/evenflow" serve' in unit
    assert f'EnvironmentFile=-"{tmp_path}/100%% cfg/evenflow.env"' in unit
    for line in ("Restart=on-failure", "WantedBy=default.target", "KillSignal=SIGTERM", "[Install]"):
        assert line in unit
    assert "loginctl enable-linger" in unit


@pytest.mark.skipif(sys.platform == "darwin", reason="systemd user units are Linux's")
def test_install_status_uninstall_under_a_temporary_home(tmp_path: Path) -> None:
    r = _cli(["install", "--no-start"], tmp_path)
    assert r.returncode == 0, r.stderr
    unit_path = tmp_path / "cfg" / "systemd" / "user" / "evenflow.service"
    env_path = tmp_path / "cfg" / "evenflow" / "evenflow.env"
    unit = unit_path.read_text()
    exe = evenflow_command()
    assert Path(exe[0]).is_absolute() and f"ExecStart={' '.join(exe)} serve" in unit
    assert f"EnvironmentFile=-{env_path}" in unit and env_path.stat().st_mode & 0o777 == 0o600
    assert read_env_file(env_path) == {}  # the template is all comments
    if shutil.which("systemd-analyze"):
        v = subprocess.run(["systemd-analyze", "verify", str(unit_path)], capture_output=True, text=True,
                           env=_env(tmp_path))
        assert v.returncode == 0, v.stderr

    d = start_daemon(tmp_path / "daemon")
    try:
        env_path.write_text(env_path.read_text() + f"EVENFLOW_HOST='127.0.0.1:{d.ctx.settings.host.port}'\n")
        r = _cli(["status"], tmp_path)
        assert "(installed)" in r.stdout and f"answers:      yes at {d.url}" in r.stdout
        assert r.returncode == 3 and "state:        unknown" in r.stdout  # no user manager reachable here
    finally:
        d.stop()
    r = _cli(["status"], tmp_path)
    assert r.returncode == 3 and "answers:      no" in r.stdout

    r = _cli(["uninstall", "--no-stop"], tmp_path)
    assert r.returncode == 0 and not unit_path.exists() and env_path.exists()
    r = _cli(["uninstall", "--no-stop"], tmp_path)
    assert r.returncode == 1 and "no evenflow service installed" in r.stderr


def test_launchd_plist_and_its_env_wrapper(tmp_path: Path) -> None:
    env_file, log = tmp_path / "evenflow.env", tmp_path / "logs" / "evenflow.log"
    plist = plistlib.loads(render_plist(["/Users/me/.local/bin/evenflow"], env_file, log))
    assert plist["Label"] == "io.evenflow.daemon" and plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["StandardErrorPath"] == str(log) and plist["ProgramArguments"][-2:] == [
        "/Users/me/.local/bin/evenflow", "serve"]
    # The wrapper really exports the settings file and execs the command: run it with a probe instead of evenflow.
    env_file.write_text("# a comment\nEVENFLOW_HOST=0.0.0.0:11500\nEVENFLOW_ADVERTISE=1\n")
    probe = [sys.executable, "-c", "import os, sys; print(os.environ['EVENFLOW_HOST'], os.environ['EVENFLOW_ADVERTISE'], "
                                   "sys.argv[1:])"]
    args = plistlib.loads(render_plist(probe, env_file, log))["ProgramArguments"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0.0.0.0:11500 1 ['serve']"
