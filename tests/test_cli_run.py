"""`evenflow run` as a user types it: the REPL in a real terminal (tmux), one-shot and piped runs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import httpx
import pytest

from api_harness import BACKENDS, Daemon, kv_used, start_daemon, upload_model


def cli_env(d: Daemon, home: Path) -> dict[str, str]:
    return {**os.environ, "EVENFLOW_HOST": d.url.removeprefix("http://"), "HOME": str(home),
            "XDG_DATA_HOME": str(home / "data"), "PYTHONUNBUFFERED": "1"}


class Terminal:
    """A tmux session on a private socket running one command; `wait` polls the screen for a state."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        if shutil.which("tmux") is None:
            pytest.fail("these tests drive a real terminal: install tmux (apt-get install -y tmux)")
        self.sock = f"evenflow-test-{uuid.uuid4().hex[:8]}"
        # sh gets the terminal's SIGINT too: a trap (not an ignore, which the child would inherit) keeps it alive
        shell = "trap : INT; " + " ".join(f"'{c}'" for c in cmd) + "; echo EXIT=$?; sleep 600"
        envs = [f"{k}={v}" for k, v in env.items() if k in ("PYTHONPATH", "EVENFLOW_HOST", "HOME", "XDG_DATA_HOME",
                                                            "PATH", "PYTHONUNBUFFERED")]
        subprocess.run(["tmux", "-L", self.sock, "new-session", "-d", "-s", "t", "-x", "120", "-y", "50",
                        "env", *envs, "sh", "-c", shell], check=True)

    def screen(self) -> str:
        out = subprocess.run(["tmux", "-L", self.sock, "capture-pane", "-p", "-t", "t", "-S", "-2000"],
                             capture_output=True, text=True)
        return out.stdout

    def send(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.sock, "send-keys", "-t", "t", *keys], check=True)

    def wait(self, pred: Callable[[str], bool], what: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.screen()
            if pred(s):
                return s
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


@pytest.fixture
def daemon(tmp_path: Path, synthetic_model) -> Iterator[Daemon]:
    d = start_daemon(tmp_path / "d", backend=BACKENDS[0], no_demo=False)
    upload_model(d.url, Path(synthetic_model("tiny", formats=("gguf",))["gguf"]), "tiny")
    yield d
    d.stop()


def run_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "evenflow.clients.cli", "run", *args]


def prompts(screen: str) -> int:
    return len(re.findall(r"^>>> ", screen, re.M))


def test_repl_streams_sets_parameters_multiline_save_and_bye(daemon: Daemon, tmp_path: Path) -> None:
    term = Terminal(run_cmd("tiny"), cli_env(daemon, tmp_path))
    try:
        term.wait(lambda s: ">>> " in s, "the prompt")
        term.send("/set parameter num_predict 5", "Enter")
        term.wait(lambda s: "Set parameter 'num_predict' to '5'" in s, "the parameter")
        term.send("/set verbose", "Enter")
        term.wait(lambda s: "Set 'verbose' mode." in s, "verbose")
        term.send("hello there", "Enter")
        s = term.wait(lambda s: "eval rate:" in s and prompts(s) >= 4, "a reply with timings")
        assert "eval count:           5 token(s)" in s and "prompt eval count:" in s
        term.send('"""first line', "Enter")
        term.wait(lambda s: "... " in s, "the continuation prompt")
        term.send('second line"""', "Enter")
        term.wait(lambda s: s.count("eval rate:") == 2 and prompts(s) >= 5, "the multi-line reply")
        term.send("/save snap", "Enter")
        term.wait(lambda s: "Created new model 'snap'" in s, "the save")
        info = httpx.post(daemon.url + "/api/show", json={"model": "snap"}, timeout=30).json()
        users = [m["content"] for m in info["messages"] if m["role"] == "user"]
        assert users == ["hello there", "first line\nsecond line"]
        assert info["parameters"].split()[:2] == ["num_predict", "5"]
        term.send("/show parameters", "Enter")
        term.wait(lambda s: "User defined parameters:" in s, "/show parameters")
        term.send('/set system """Be brief.', "Enter")
        term.send('Very brief."""', "Enter")
        term.wait(lambda s: "Set system message." in s, "the system message")
        term.send("/show system", "Enter")
        term.wait(lambda s: "Be brief.\nVery brief.\n>>> " in s, "/show system")
        term.send("Up", "Up")  # history: the line before /show system
        term.wait(lambda s: s.rstrip().splitlines()[-1] == '>>> Very brief."""', "the history recall")
        term.send("C-u")
        term.send("/nope", "Enter")
        term.wait(lambda s: "Unknown command '/nope'. Type /? for help" in s, "the unknown-command message")
        term.send("/bye", "Enter")
        term.wait(lambda s: "EXIT=0" in s, "exit status 0")
    finally:
        term.close()


def test_ctrl_c_stops_a_reply_and_frees_the_sequence(daemon: Daemon, tmp_path: Path) -> None:
    term = Terminal(run_cmd("demo", "--nowordwrap"), cli_env(daemon, tmp_path))
    try:
        term.wait(lambda s: ">>> " in s, "the prompt")
        term.send("/set parameter num_predict 100000", "Enter")  # the demo would run until its window is full
        term.wait(lambda s: "Set parameter" in s, "the parameter")
        term.send("tell me a long story", "Enter")
        manager = daemon.ctx.manager
        deadline = time.monotonic() + 120
        while not (manager.models.get("demo:latest") and kv_used(daemon, "demo:latest") > 0):
            assert time.monotonic() < deadline, "the reply never started"
            time.sleep(0.1)
        term.send("C-c")
        term.wait(lambda s: prompts(s) >= 3, "the prompt back after Ctrl-C")
        deadline = time.monotonic() + 60
        while kv_used(daemon, "demo:latest") > 0:  # the daemon aborted the sequence and freed its KV
            assert time.monotonic() < deadline, "the sequence was not freed"
            time.sleep(0.1)
        metrics = httpx.get(daemon.url + "/metrics", timeout=30).text
        assert re.search(r'evenflow_sequences_finished_total\{model="demo:latest",reason="abort"\} 1\.0', metrics)
        term.send("C-d")
        term.wait(lambda s: "EXIT=0" in s, "Ctrl-D exits 0")
    finally:
        term.close()


def test_one_shot_and_piped_runs(daemon: Daemon, tmp_path: Path) -> None:
    env = cli_env(daemon, tmp_path)
    # the demo's num_predict default (a model parameter) ends the README's example; --verbose prints timings
    out = subprocess.run(run_cmd("demo", "hello", "--verbose"), env=env, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    count = re.search(r"^eval count: +(\d+) token\(s\)$", out.stderr, re.M)
    assert count and 0 < int(count.group(1)) <= 128 and "total duration:" in out.stderr  # 128, or an early <|im_end|>
    out = subprocess.run(run_cmd("tiny", "--verbose"), env=env, input="piped prompt", capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0 and "eval count:" in out.stderr, out.stderr
    # a missing model is pulled first, as Ollama's run does (here from a loopback port where nothing listens)
    out = subprocess.run(run_cmd("127.0.0.1:9/library/nothere", "hi", "--insecure"), env=env, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "pulling manifest" in out.stderr, out.stderr
    assert "Error: pull model manifest: cannot reach the registry at 127.0.0.1:9" in out.stderr


def test_timings_use_go_durations() -> None:
    from evenflow.clients.session import go_duration

    assert [go_duration(n) for n in (999, 15_491, 12_345_000, 1_500_000_000, 62_500_000_000, 3_600_000_000_000)] == \
        ["999ns", "15.491µs", "12.345ms", "1.5s", "1m2.5s", "1h0m0s"]
