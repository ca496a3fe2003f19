"""The GPU-offload path on a real ggml device without a GPU: llama.cpp's RPC backend. A server (an RPC build of
llama-cpp-python, `python -m evenflow.backends.llamacpp.rpc serve`) lends its CPU device; the daemon's side adds it
(EVENFLOW_LLAMACPP_RPC) and offloads every layer, model and KV buffers to it through the same code as CUDA or
Metal. Greedy tokens at full offload, mixed batches and every chunk size, must equal the CPU build's; then the
backend's own mixed-batch and chunk-invariance tests run at full offload.

Needs the RPC build in a side folder: EVENFLOW_RPC_LLAMA_CPP=<pip --target folder> (packaging/rpc_check.sh builds
it into ~/.cache/evenflow/lcp-rpc and runs this file); skipped without it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIDE = Path(os.environ.get("EVENFLOW_RPC_LLAMA_CPP", Path.home() / ".cache" / "evenflow" / "lcp-rpc"))
pytestmark = pytest.mark.skipif(not (SIDE / "llama_cpp" / "lib" / "libggml-rpc.so").exists(),
                                reason=f"no RPC build of llama-cpp-python in {SIDE} (packaging/rpc_check.sh builds it)")


def _evenflow_path(tmp: Path) -> str:
    """A folder whose `evenflow` is this checkout."""
    (tmp / "evenflow").symlink_to(ROOT, target_is_directory=True)
    return str(tmp)


@pytest.fixture(scope="module")
def rpc_env(tmp_path_factory):
    pp = _evenflow_path(tmp_path_factory.mktemp("pp"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SIDE), pp])}
    env.pop("EVENFLOW_LLAMACPP_RPC", None)
    server = subprocess.Popen([sys.executable, "-m", "evenflow.backends.llamacpp.rpc", "serve", f"127.0.0.1:{port}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                time.sleep(0.05)
        yield {**env, "EVENFLOW_LLAMACPP_RPC": f"127.0.0.1:{port}"}, pp
    finally:
        server.kill()
        server.wait(10)


def greedy(gguf: Path, env: dict, mode: str, num_gpu: str = "none") -> dict:
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "rpc_offload_check.py"), str(gguf), mode, num_gpu],
                       env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])


@pytest.fixture(scope="module")
def gguf(synthetic_model):
    return synthetic_model("tiny", "llama", formats=("gguf",), gguf_dtype="f32", qk_std=0.3)["gguf"]


def test_full_offload_to_the_rpc_device_gives_the_cpu_builds_tokens(rpc_env, gguf):
    env, pp = rpc_env
    off = greedy(gguf, env, "offload")
    n_layers = 2  # the tiny preset's blocks
    assert off["device"] == "gpu" and off["gpu_layers"] == n_layers + 1 and off["devices"] == ["RPC0"]
    assert off["assigned_rpc"] == n_layers + 1  # llama.cpp: "layer N assigned to device RPC0[...]", head included
    assert any("model buffer size" in b for b in off["rpc_buffers"]) and any("KV buffer" in b for b in off["rpc_buffers"])
    assert off["vram_bytes"] > 0
    # the CPU build (the installed llama-cpp-python, no RPC), same settings
    cpu_env = {k: v for k, v in env.items() if k != "EVENFLOW_LLAMACPP_RPC"}
    cpu_env["PYTHONPATH"] = os.pathsep.join([pp, *filter(None, [os.environ.get("PYTHONPATH")])])
    cpu = greedy(gguf, cpu_env, "cpu")
    assert cpu["gpu_layers"] == 0 and cpu["vram_bytes"] == 0
    for chunk in (None, 1, 7, 64):
        assert off[f"tokens_chunk_{chunk}"] == cpu["tokens_chunk_None"], f"chunk {chunk} at full offload"
    # num_gpu 0 in the RPC build: nothing offloaded
    none = greedy(gguf, env, "cpu", "0")
    assert none["gpu_layers"] == 0 and none["assigned_rpc"] == 0 and none["tokens_chunk_None"] == cpu["tokens_chunk_None"]


def test_backend_invariance_tests_at_full_offload(rpc_env):
    """The llama.cpp backend's mixed-batch and chunk tests and the engine's chunk invariance, every layer on RPC0."""
    env, _ = rpc_env
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "log_cli=true",
                        "--log-cli-level=INFO",
                        "tests/test_llamacpp_backend.py::test_mixed_batch_logits_equal_each_sequence_alone",
                        "tests/test_llamacpp_backend.py::test_greedy_same_for_every_chunk_size_and_high_level_llama",
                        "tests/test_engine_backends.py", "-k", "llamacpp"],
                       env=env, capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:]
    assert " passed" in r.stdout.splitlines()[-1] and "failed" not in r.stdout.splitlines()[-1]
    loads = [ln for ln in r.stdout.splitlines() if "llama.cpp loaded" in ln]
    assert loads and all("gpu layers=3/3" in ln and "on RPC0" in ln for ln in loads), loads[:3]
