"""What this machine gives the backends: the llama.cpp build and the devices it sees, an NVIDIA GPU it leaves
unused, torch's CUDA, MLX. `evenflow serve` logs it at start; `evenflow serve --check` prints it and exits."""
from __future__ import annotations

import importlib.util
import logging
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from .llamacpp import build_info

log = logging.getLogger(__name__)
GiB = 1 << 30


@dataclass
class Report:
    llama_variant: str = "none"  # build_info's variant: cpu+mtmd, cuda+mtmd, ...
    llama_version: str = ""
    llama_devices: list[str] = field(default_factory=list)  # "CUDA0 (NVIDIA GeForce RTX 4090, gpu, 23.1/24.0 GiB free)"
    llama_offload: bool = False
    nvidia_gpus: list[str] = field(default_factory=list)  # nvidia-smi -L lines, or torch's device names
    torch: str = ""  # "2.13.0 (CUDA 12.4: NVIDIA GeForce RTX 4090)" | "2.13.0 (CPU)" | "" (absent)
    mlx: str = ""
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"llama.cpp: llama-cpp-python {self.llama_version or '-'}, build {self.llama_variant}, "
               f"GPU offload {'yes' if self.llama_offload else 'no'}"]
        out += [f"  device {d}" for d in self.llama_devices]
        out.append(f"NVIDIA GPUs: {', '.join(self.nvidia_gpus) if self.nvidia_gpus else 'none found'}")
        out.append(f"torch: {self.torch or 'not installed'}")
        if platform.system() == "Darwin":
            out.append(f"mlx: {self.mlx or 'not installed'}")
        gguf = "llama.cpp, all layers that fit on the GPU" if self.llama_offload else "llama.cpp on the CPU"
        hf = ("MLX" if self.mlx else "torch") if platform.system() == "Darwin" and self.mlx else \
            ("torch on CUDA" if "CUDA" in self.torch else "torch on the CPU")
        out.append(f"auto backend: a GGUF -> {gguf}; an HF folder -> {hf}")
        out += [f"WARNING: {w}" for w in self.warnings]
        return out


def rebuild_command(variant: str, version: str) -> str:
    """The command that rebuilds llama-cpp-python as `variant` (cuda | metal) for this Python."""
    flag = {"cuda": "-DGGML_CUDA=on", "metal": "-DGGML_METAL=on"}[variant]
    spec = f"llama-cpp-python=={version}" if version else "llama-cpp-python"
    return (f'CMAKE_ARGS="{flag}" {sys.executable} -m pip install --no-cache-dir --force-reinstall --no-deps '
            f'"{spec}"  (or, in a checkout: bash packaging/dev.sh llama)')


def nvidia_smi_gpus() -> list[str]:
    """`nvidia-smi -L` lines ("GPU 0: NVIDIA GeForce RTX 4090 (UUID: ...)"), [] without a driver."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split(" (UUID")[0].strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def _torch(probe: bool) -> tuple[str, list[str]]:
    if importlib.util.find_spec("torch") is None:
        return "", []
    if not probe:
        return "installed (not probed)", []
    try:
        import torch

        if torch.cuda.is_available():
            names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            return f"{torch.__version__} (CUDA {torch.version.cuda}: {', '.join(names)})", names
        return f"{torch.__version__} (CPU)", []
    except Exception as e:  # noqa: BLE001 - a broken CUDA install is a fact to report
        return f"broken ({type(e).__name__}: {e})", []


def gather(probe_torch: bool = True) -> Report:
    """The report; `probe_torch=False` skips importing torch (the daemon's start-up stays fast)."""
    r = Report()
    info = build_info.read()
    r.llama_variant, r.llama_version = info.variant, info.version
    if info.installed:
        try:
            from .llamacpp.devices import list_devices, supports_gpu_offload
            from .llamacpp.rpc import add_servers_from_env

            add_servers_from_env()
            r.llama_offload = supports_gpu_offload()
            r.llama_devices = [f"{d.name} ({d.description}, {d.kind}, {d.free / GiB:.1f}/{d.total / GiB:.1f} GiB free)"
                               for d in list_devices()]
        except Exception as e:  # noqa: BLE001
            r.warnings.append(f"llama.cpp could not list its devices: {type(e).__name__}: {e}")
    r.torch, torch_gpus = _torch(probe_torch)
    if platform.system() == "Darwin" and importlib.util.find_spec("mlx"):
        r.mlx = "installed (Metal)"
    r.nvidia_gpus = nvidia_smi_gpus() or torch_gpus
    if r.nvidia_gpus and info.installed and info.gpu != "cuda":
        r.warnings.append(f"an NVIDIA GPU is present but llama.cpp was built for {info.gpu or 'the CPU'}: GGUF "
                          f"models will not use the GPU. Fix: {rebuild_command('cuda', info.version)}")
    if r.nvidia_gpus and r.torch.endswith("(CPU)"):
        r.warnings.append("an NVIDIA GPU is present but torch is a CPU build: HF models will run on the CPU. Fix: "
                          f"{sys.executable} -m pip install --force-reinstall torch --index-url "
                          "https://download.pytorch.org/whl/cu124")
    if platform.system() == "Darwin" and platform.machine() == "arm64" and info.installed and info.gpu != "metal":
        r.warnings.append(f"llama.cpp was built without Metal: fix: {rebuild_command('metal', info.version)}")
    if info.installed and not info.mtmd:
        r.warnings.append("llama.cpp was built without libmtmd (LLAVA_BUILD=OFF): vision models cannot load; "
                          "rebuild with `bash packaging/dev.sh llama` or without -DLLAVA_BUILD=OFF")
    if not info.installed:
        r.warnings.append("llama-cpp-python is not installed: GGUF models cannot load")
    return r


def log_report() -> None:
    """The report in the daemon's log at start (torch not imported); never raises."""
    try:
        r = gather(probe_torch=False)
    except Exception:  # noqa: BLE001 - a report must not stop the daemon
        log.warning("could not gather the device report", exc_info=True)
        return
    for line in r.lines():
        (log.warning if line.startswith("WARNING") else log.info)("%s", line.removeprefix("WARNING: "))
