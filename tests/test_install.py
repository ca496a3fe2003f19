"""The plain install path: the wheel installed into a fresh venv gives a working `evenflow` (version, a generate on
the demo model). The venv sees the packages of the interpreter running the tests, so torch and the compiled
llama-cpp-python are reused: those of a virtual environment the tests run in (README's way), or the system's."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from evenflow import __version__

ROOT = Path(__file__).resolve().parents[1]


def _site_dirs() -> list[str]:
    """The site-packages folders this interpreter imports from. Inside a venv these are the venv's own (plus the
    system's with --system-site-packages); `python -m venv --system-site-packages` from here would instead see the
    base interpreter's, which in a newcomer's venv hold none of our dependencies (issue 27)."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _venv_with_our_packages(venv: Path) -> Path:
    """A fresh venv whose site-packages ends with ours (a .pth file of plain paths: their own .pth files, such as
    an editable install of this checkout, are not run); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / "evenflow-test-parent.pth").write_text("".join(p + "\n" for p in _site_dirs()))
    return python


def test_wheel_in_a_fresh_venv_serves_the_demo(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("evenflow-*.whl"))
    venv = tmp_path / "venv"
    python = _venv_with_our_packages(venv)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EVENFLOW_HOST", "OLLAMA_HOST")}
    env |= {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "home" / "cfg"),
            "XDG_DATA_HOME": str(tmp_path / "home" / "data")}
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True,
                   env=env, capture_output=True)
    where = subprocess.run([str(python), "-c", "import evenflow; print(evenflow.__file__)"],
                           env=env, capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(venv)), where  # the installed copy, not a checkout or an editable install
    evenflow = str(venv / "bin" / "evenflow")
    env["EVENFLOW_HOST"] = "127.0.0.1:9"  # nothing listens there: --version reports the client alone
    r = subprocess.run([evenflow, "--version"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and __version__ in r.stdout + r.stderr

    p = subprocess.Popen([evenflow, "serve", "--host", "127.0.0.1:0", "--ollama-store", str(tmp_path / "none")],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        url = None
        for line in p.stdout:
            m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the installed daemon did not start"
        deadline = time.monotonic() + 300  # the demo model is written before the first request is served
        while True:
            try:
                httpx.get(url + "/", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.2)
        r = httpx.post(url + "/api/generate", json={"model": "demo", "prompt": "Hello", "stream": False,
                                                   "options": {"num_predict": 4}}, timeout=300)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["done"] is True and 1 <= body["eval_count"] <= 4
    finally:
        p.terminate()
        p.wait(60)
