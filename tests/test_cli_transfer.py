"""`evenflow create -f`, `pull` and `push` run as a user runs them (subprocesses against a real daemon)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import ollama
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model
from registry_server import Registry


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path / "d", backend=BACKENDS[0])
    yield d
    d.stop()


def cli(d: Daemon, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = {**os.environ, "EVENFLOW_HOST": d.url.removeprefix("http://")}
    return subprocess.run([sys.executable, "-m", "evenflow.clients.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_create_from_a_gguf_file(daemon: Daemon, tmp_path: Path, synthetic_model) -> None:
    src = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    work = tmp_path / "work"
    work.mkdir()
    (work / "tiny.gguf").write_bytes(src.read_bytes())
    (work / "Modelfile").write_text("# a comment\nFROM ./tiny.gguf\nPARAMETER temperature 0\n")
    out = cli(daemon, "create", "mine", cwd=work)  # -f defaults to ./Modelfile
    assert out.returncode == 0, out.stderr
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert "gathering model components" in out.stderr and f"copying file {digest[:12]}" in out.stderr
    assert out.stderr.rstrip().endswith("success")
    c = ollama.Client(host=daemon.url)
    assert c.show("mine").parameters.split() == ["temperature", "0"]
    assert c.generate("mine", "hi", options={"num_predict": 2}).eval_count == 2
    # again, from another directory: the Modelfile's FROM is relative to the Modelfile; the blob is not re-sent
    out = cli(daemon, "create", "mine2", "-f", str(work / "Modelfile"), cwd=tmp_path)
    assert out.returncode == 0 and f"using existing blob {digest[:12]}" in out.stderr, out.stderr


def test_create_from_a_safetensors_folder(daemon: Daemon, tmp_path: Path, synthetic_model) -> None:
    hf = Path(synthetic_model("tiny", formats=("hf",))["hf"])
    (tmp_path / "Modelfile").write_text(f"FROM {hf}\n")
    out = cli(daemon, "create", "st", "-f", str(tmp_path / "Modelfile"))
    assert out.returncode == 0, out.stderr
    assert ollama.Client(host=daemon.url).show("st").details.format == "safetensors"


def test_create_from_a_model_with_overrides(daemon: Daemon, tmp_path: Path, synthetic_model) -> None:
    upload_model(daemon.url, Path(synthetic_model("tiny", formats=("gguf",))["gguf"]), "tiny")
    (tmp_path / "Modelfile").write_text(
        'FROM tiny\nSYSTEM """You are terse.\nVery terse."""\nPARAMETER num_predict 7\nPARAMETER stop "<end>"\n'
        'PARAMETER stop "<stop>"\nTEMPLATE "{{ .System }}|{{ .Prompt }}"\nMESSAGE user hello\n'
        'MESSAGE assistant "hi there"\n')
    out = cli(daemon, "create", "derived", "-f", str(tmp_path / "Modelfile"))
    assert out.returncode == 0, out.stderr
    info = httpx.post(daemon.url + "/api/show", json={"model": "derived"}, timeout=30).json()
    assert info["system"] == "You are terse.\nVery terse."
    assert info["template"] == "{{ .System }}|{{ .Prompt }}"
    assert info["messages"] == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi there"}]
    assert info["parameters"].splitlines() == ['num_predict                    7', 'stop                           "<end>"',
                                               'stop                           "<stop>"']
    r = ollama.Client(host=daemon.url).generate("derived", "x")
    assert r.eval_count <= 7  # the PARAMETER is the default


def test_create_errors_are_clear(daemon: Daemon, tmp_path: Path, synthetic_model) -> None:
    mf = tmp_path / "Modelfile"
    mf.write_text("FROM ./missing.gguf\n")
    out = cli(daemon, "create", "x", "-f", str(mf))
    assert out.returncode == 1 and "FROM ./missing.gguf: no such file or directory" in out.stderr
    mf.write_text("FROM tiny\nBOGUS thing\n")
    out = cli(daemon, "create", "x", "-f", str(mf))
    assert out.returncode == 1 and "line 2: command must be one of" in out.stderr
    out = cli(daemon, "create", "x", "-f", str(tmp_path / "nope"))
    assert out.returncode == 1 and "cannot read the Modelfile" in out.stderr
    (tmp_path / "t.gguf").write_bytes(Path(synthetic_model("tiny", formats=("gguf",))["gguf"]).read_bytes())
    mf.write_text("FROM ./t.gguf\n")
    out = cli(daemon, "create", "x", "-f", str(mf), "--quantize", "q4_K_M")
    assert out.returncode == 1 and "quantization is not supported" in out.stderr
    assert "x:latest" not in [m.model for m in ollama.Client(host=daemon.url).list().models]


def test_cli_pull_and_push(daemon: Daemon, tmp_path: Path, synthetic_model) -> None:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    reg = Registry()
    try:
        raw = reg.add_model("library", "tiny", "latest", gguf)
        out = cli(daemon, "pull", f"http://{reg.host}/library/tiny", "--insecure")
        assert out.returncode == 0, out.stderr
        digest = json.loads(raw)["layers"][0]["digest"]
        lines = out.stderr.splitlines()
        assert lines[0] == "pulling manifest" and lines[-1] == "success"
        assert any(line.startswith(f"pulling {digest[7:19]}: 100%") for line in lines), lines
        assert "verifying sha256 digest" in lines and "writing manifest" in lines
        out = cli(daemon, "cp", f"{reg.host}/library/tiny", f"{reg.host}/me/copy:v2")
        assert out.returncode == 0, out.stderr
        out = cli(daemon, "push", f"http://{reg.host}/me/copy:v2", "--insecure")
        assert out.returncode == 0 and out.stderr.splitlines()[-1] == "success", out.stderr
        assert reg.manifests[("me", "copy", "v2")] == raw
        out = cli(daemon, "pull", f"http://{reg.host}/library/absent", "--insecure")
        assert out.returncode == 1 and "Error: pull model manifest: file does not exist" in out.stderr
    finally:
        reg.close()


def test_version_and_start_alias(daemon: Daemon) -> None:
    from evenflow import __version__

    out = cli(daemon, "-v")
    assert out.returncode == 0 and out.stdout.strip() == f"evenflow version is {__version__} (Ollama API 0.13.0)"
    daemon.stop()  # nothing answers now: Ollama's two warnings
    out = cli(daemon, "--version")
    assert out.stdout.splitlines() == ["Warning: could not connect to a running evenflow instance",
                                       f"Warning: client version is {__version__}"]
    out = cli(daemon, "start", "--help")
    assert out.returncode == 0 and "--max-queue" in out.stdout
