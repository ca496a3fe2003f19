"""`evenflow serve --check` and the start-up log: the llama.cpp build, its devices, and a warning with the fixing
command when an NVIDIA GPU is present but llama.cpp was built for the CPU."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from evenflow.backends import gpu_report
from evenflow.backends.llamacpp.build_info import read

pytest.importorskip("llama_cpp")


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-1234)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_cpu_build_beside_an_nvidia_gpu_is_a_warning_with_the_fix(fake_gpu):
    if read().gpu == "cuda":
        pytest.skip("this llama.cpp is a CUDA build")
    r = gpu_report.gather(probe_torch=False)
    assert r.nvidia_gpus == ["GPU 0: NVIDIA GeForce RTX 4090"]
    fix = f'CMAKE_ARGS="-DGGML_CUDA=on" {sys.executable} -m pip install --no-cache-dir --force-reinstall --no-deps ' \
          f'"llama-cpp-python=={read().version}"'
    assert any("NVIDIA GPU is present but llama.cpp was built for the CPU" in w and fix in w for w in r.warnings)
    assert any(line.startswith("  device CPU (") for line in r.lines())


def test_a_cpu_torch_beside_an_nvidia_gpu_is_a_warning(fake_gpu):
    r = gpu_report.gather(probe_torch=True)
    if not r.torch.endswith("(CPU)"):
        pytest.skip(f"torch here: {r.torch or 'absent'}")
    assert any("torch is a CPU build" in w and "download.pytorch.org/whl/cu124" in w for w in r.warnings)


def test_no_gpu_no_warning_about_it(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi
    r = gpu_report.gather(probe_torch=False)
    if r.nvidia_gpus or os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA GPU")
    assert not any("NVIDIA" in w for w in r.warnings)
    assert r.llama_offload == (read().gpu is not None)


def test_the_start_up_log_names_the_devices(fake_gpu, caplog):
    with caplog.at_level(logging.INFO, logger="evenflow.backends.gpu_report"):
        gpu_report.log_report()
    text = caplog.text
    assert "llama.cpp: llama-cpp-python" in text and "device CPU (" in text
    if read().gpu != "cuda":
        assert any(r.levelno == logging.WARNING and "-DGGML_CUDA=on" in r.getMessage() for r in caplog.records)


def test_serve_check_prints_and_exits(fake_gpu):
    p = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "serve", "--check"], capture_output=True,
                       text=True, timeout=120)
    assert "llama.cpp: llama-cpp-python" in p.stdout and "auto backend: a GGUF -> llama.cpp" in p.stdout
    assert p.returncode == (1 if "WARNING" in p.stdout else 0)
    if read().gpu != "cuda":
        assert p.returncode == 1 and "-DGGML_CUDA=on" in p.stdout
