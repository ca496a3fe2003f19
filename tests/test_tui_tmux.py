"""`evenflow monitor` in a real terminal (tmux): the screen shows a live stream and changes between captures."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from api_harness import BACKENDS, StepGate, start_daemon, upload_model

TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install -y tmux; .ci/run installs it)")
def test_monitor_in_tmux_shows_a_live_stream(tmp_path: Path, synthetic_model) -> None:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    backend = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
    d = start_daemon(tmp_path, backend=backend, context_length="2048", log_content="1")
    upload_model(d.url, gguf, "tiny")
    sock = f"evenflow-test-{os.getpid()}"
    tmux = [TMUX, "-L", sock]
    cmd = f"{sys.executable} -m evenflow.clients.cli monitor --host {d.url}"
    stop = threading.Event()
    gate = StepGate(d, "tiny")

    def pace() -> None:  # steps go through at ~100 a second, so a stream is caught decoding
        while not stop.is_set():
            gate.allow(1)
            time.sleep(0.01)

    def load() -> None:  # one 400-token stream at a time
        while not stop.is_set():
            httpx.post(d.url + "/api/generate", timeout=120, json={
                "model": "tiny", "prompt": "Tell me a long story", "stream": False,
                "options": {"temperature": 0, "num_predict": 400, "ignore_eos": True}})

    def capture() -> str:
        return subprocess.run(tmux + ["capture-pane", "-p", "-t", "mon"], capture_output=True, text=True).stdout

    def wait_for(cond, what: str) -> str:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            screen = capture()
            if cond(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{capture()}")

    worker = threading.Thread(target=load, daemon=True)
    pacer = threading.Thread(target=pace, daemon=True)
    try:
        subprocess.run(tmux + ["new-session", "-d", "-s", "mon", "-x", "100", "-y", "30", cmd], check=True,
                       env={**os.environ, "TERM": "xterm-256color"})
        wait_for(lambda s: "connected to" in s, "the monitor to connect")
        worker.start()
        pacer.start()
        first = wait_for(lambda s: "decoding" in s and "tiny" in s, "a live stream on screen")
        second = wait_for(lambda s: s != first and "decoding" in s, "the screen to change")
        assert first != second
        subprocess.run(tmux + ["send-keys", "-t", "mon", "q"], check=True)
        deadline = time.monotonic() + 30
        while subprocess.run(tmux + ["has-session", "-t", "mon"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "q did not quit the monitor"
            time.sleep(0.2)
    finally:
        stop.set()
        gate.close()
        subprocess.run(tmux + ["kill-server"], capture_output=True)
        worker.join(130) if worker.is_alive() else None
        d.stop()
