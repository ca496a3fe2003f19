"""packaging/dev.sh builds llama-cpp-python for the machine: it reads the installed variant from the package's
libraries (backends/llamacpp/build_info.py) and rebuilds when it differs from the wanted one (a cached CPU wheel
without libmtmd, say). These run dev.sh's `llama-plan` (the decision, no build) against made-up packages."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from evenflow.backends.llamacpp.build_info import read

ROOT = Path(__file__).resolve().parents[1]


def fake_package(site: Path, libs: list[str], version: str = "0.3.36") -> Path:
    pkg = site / "llama_cpp"
    (pkg / "lib").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{version}"\n')
    for name in libs:
        (pkg / "lib" / name).write_bytes(b"")
    return pkg


CPU_NO_MTMD = ["libggml.so", "libggml-base.so", "libggml-cpu.so", "libllama.so"]
CPU = CPU_NO_MTMD + ["libmtmd.so", "libmtmd.so.0"]
CUDA = CPU + ["libggml-cuda.so"]


def test_build_info_reads_the_libraries(tmp_path):
    assert read(str(fake_package(tmp_path / "a", CPU_NO_MTMD))).variant == "cpu"
    info = read(str(fake_package(tmp_path / "b", CUDA)))
    assert info.variant == "cuda+mtmd" and info.gpu == "cuda" and info.version == "0.3.36"
    assert read(str(fake_package(tmp_path / "c", CPU + ["libggml-rpc.so"]))).variant == "cpu+rpc+mtmd"
    mac = ["libggml.dylib", "libggml-base.dylib", "libggml-cpu.dylib", "libggml-metal.dylib", "libmtmd.dylib"]
    assert read(str(fake_package(tmp_path / "d", mac))).variant == "metal+mtmd"


def plan(site: Path, tmp_path: Path, path_dirs: list[Path] = (), **env: str) -> str:
    e = {k: v for k, v in os.environ.items() if k not in ("EVENFLOW_LLAMA_VARIANT", "CMAKE_ARGS")}
    e["PYTHONPATH"] = str(site)  # its llama_cpp comes before the installed one
    e["PATH"] = os.pathsep.join([*map(str, path_dirs), e["PATH"]])
    e.update(env)
    return subprocess.run(["bash", str(ROOT / "packaging" / "dev.sh"), "llama-plan"], capture_output=True, text=True,
                          env=e, check=True, cwd=tmp_path).stdout.strip()


def test_a_cached_cpu_wheel_without_mtmd_is_rebuilt(tmp_path):
    site = tmp_path / "site"
    fake_package(site, CPU_NO_MTMD)
    assert plan(site, tmp_path, EVENFLOW_LLAMA_VARIANT="cpu") == "build cpu+mtmd"
    shutil.rmtree(site)
    fake_package(site, CPU)
    assert plan(site, tmp_path, EVENFLOW_LLAMA_VARIANT="cpu") == "keep cpu+mtmd"
    assert plan(site, tmp_path, EVENFLOW_LLAMA_VARIANT="cpu", CMAKE_ARGS="-DGGML_AVX512=OFF") == "keep cpu+mtmd"


def test_a_cuda_machine_wants_cuda(tmp_path):
    site = tmp_path / "site"
    fake_package(site, CPU)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("nvcc", "nvidia-smi"):  # a toolkit and a driver that lists a GPU
        (bin_dir / tool).write_text("#!/bin/sh\necho 'GPU 0: NVIDIA GeForce RTX 4090'\n")
        (bin_dir / tool).chmod(0o755)
    assert plan(site, tmp_path, [bin_dir]) == "build cuda+mtmd -DGGML_CUDA=on"
    assert plan(site, tmp_path, [bin_dir], CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=89") == \
        "build cuda+mtmd -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=89"
    shutil.rmtree(site)
    fake_package(site, CUDA)
    assert plan(site, tmp_path, [bin_dir]) == "keep cuda+mtmd"
    assert plan(site, tmp_path, [bin_dir], EVENFLOW_LLAMA_VARIANT="metal") == "build metal+mtmd -DGGML_METAL=on"


def test_a_toolkit_without_a_gpu_builds_for_the_cpu(tmp_path):
    has_gpu = os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi")
    if has_gpu or not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")):
        pytest.skip("needs a CUDA toolkit and no NVIDIA driver")
    site = tmp_path / "site"
    fake_package(site, CPU)
    assert plan(site, tmp_path) == "keep cpu+mtmd"


def test_a_bad_variant_is_refused(tmp_path):
    e = {**os.environ, "EVENFLOW_LLAMA_VARIANT": "rocm"}
    r = subprocess.run(["bash", str(ROOT / "packaging" / "dev.sh"), "llama-plan"], capture_output=True, text=True, env=e)
    assert r.returncode == 2 and "EVENFLOW_LLAMA_VARIANT=rocm: expected cpu, cuda or metal" in r.stderr


def test_build_info_follows_llama_cpp_lib_path(tmp_path, monkeypatch):
    pytest.importorskip("llama_cpp")
    libs = tmp_path / "libs"
    libs.mkdir()
    for name in CUDA:
        (libs / name).write_bytes(b"")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(libs))  # llama_cpp loads its libraries from there
    info = read()
    assert info.lib_dir == str(libs) and info.variant == "cuda+mtmd"
