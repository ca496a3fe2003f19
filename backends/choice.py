"""Which backend serves a model: chosen per model (its file format) and per machine, as Ollama does.

A GGUF runs on llama.cpp everywhere: llama.cpp knows every architecture a GGUF carries, and its CUDA, Metal,
Vulkan and ROCm kernels are where the model's layers go when the build can offload (the runner decides how
many). An HF safetensors folder runs on torch CUDA on an NVIDIA GPU, MLX on Apple Silicon, torch on the CPU
elsewhere (torch picks CUDA itself when it sees a GPU). `choose_backend` is pure; `probe_machine` gathers the facts.
What each backend runs, architecture by architecture, is declared once here (`BACKEND_ARCHITECTURES`).
"""
from __future__ import annotations

import importlib.util
import os
import platform
import struct
from dataclasses import dataclass

GGUF_MAGIC = b"GGUF"

# The architectures (GGUF general.architecture) each backend runs; None = every one its build knows. torch and MLX
# implement the Llama decoder family themselves (backends/*/models/llama.py); llama.cpp also runs the sliding-window
# (gemma3, gpt-oss), MoE (qwen3moe, gpt-oss, deepseek2), MLA (deepseek2) and hybrid recurrent (lfm2, qwen35, ...)
# families, which reach torch and MLX never.
LLAMA_DECODERS = ("llama", "mistral", "qwen2", "qwen3")  # common.model_args.SUPPORTED_ARCHITECTURES
BACKEND_ARCHITECTURES: dict[str, tuple[str, ...] | None] = {
    "llamacpp": None,
    "torch": LLAMA_DECODERS,
    "mlx": LLAMA_DECODERS,
}


def runs(backend: str, architecture: str | None) -> bool:
    """Whether `backend` runs models of `architecture` (an unknown one: left to the loader)."""
    known = BACKEND_ARCHITECTURES.get(backend)
    return known is None or architecture is None or architecture in known


def backends_for(architecture: str) -> list[str]:
    return [b for b in BACKEND_ARCHITECTURES if runs(b, architecture)]


def gguf_architecture(path: str) -> str | None:
    """A GGUF file's general.architecture, read from its first metadata key where converters write it (None: not a
    GGUF, or not found there: the loader then reads the whole header and says what it cannot run)."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
            if len(head) < 24 or head[:4] != GGUF_MAGIC or struct.unpack_from("<Q", head, 16)[0] == 0:
                return None
            (n,) = struct.unpack("<Q", f.read(8))
            if n != len(b"general.architecture") or f.read(n) != b"general.architecture":
                return None
            kind, size = struct.unpack("<IQ", f.read(12))
            value = f.read(size) if kind == 8 and size <= 64 else b""  # 8: a string
    except (OSError, struct.error):
        return None
    return value.decode("utf-8", "replace") or None


def unsupported(backend: str, model_path: str) -> str | None:
    """Why `backend` cannot run the model (its architecture and the backends that run it), None when it can."""
    arch = gguf_architecture(model_path) if BACKEND_ARCHITECTURES.get(backend) is not None else None
    if runs(backend, arch):
        return None
    return (f"{model_path}: the {backend} backend does not run architecture {arch!r} (it runs "
            f"{', '.join(BACKEND_ARCHITECTURES[backend] or ())}); {arch} runs on: {', '.join(backends_for(arch))} "
            f"(EVENFLOW_BACKEND=auto picks it for a GGUF)")


@dataclass(frozen=True)
class Machine:
    """What this machine offers the backends."""

    apple_silicon: bool
    has_mlx: bool
    has_torch: bool  # torch then picks CUDA when it sees a GPU, else the CPU
    has_llamacpp: bool


def model_format(path: str) -> str:
    """"gguf" for a file starting with the GGUF magic, "safetensors" for a folder, "unknown" otherwise."""
    if os.path.isdir(path):
        return "safetensors"
    try:
        with open(path, "rb") as f:
            return "gguf" if f.read(4) == GGUF_MAGIC else "unknown"
    except OSError:
        return "unknown"


def choose_backend(fmt: str, machine: Machine, architecture: str | None = None) -> str:
    """The backend for a model of format `fmt` (and `architecture`, where known) on `machine` (the loader then
    reports what it cannot read)."""
    if fmt == "gguf" and machine.has_llamacpp:
        return "llamacpp"
    if fmt == "gguf" and not runs("torch", architecture):  # only llama.cpp runs it: its loader names what is missing
        return "llamacpp"
    if machine.apple_silicon and machine.has_mlx:
        return "mlx"
    if machine.has_torch:
        return "torch"
    if machine.has_llamacpp:  # no torch: llama.cpp is all there is, and says itself that it wants a GGUF
        return "llamacpp"
    return "torch"  # nothing installed: torch's loader names the missing package


def probe_machine() -> Machine:
    """Installed packages (no import: a GGUF must not wait for torch to load)."""
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    found = lambda name: importlib.util.find_spec(name) is not None  # noqa: E731
    return Machine(apple_silicon=apple, has_mlx=apple and found("mlx"), has_torch=found("torch"),
                   has_llamacpp=found("llama_cpp"))


_vram: dict[str, int] = {}


def total_vram(backend: str) -> int:
    """Total memory of the GPU(s) `backend` would use (0 without one): Ollama's default window keys on it. llama.cpp:
    the devices it offloads to; torch: CUDA device 0; MLX: Metal's recommended working set. Cached per process."""
    if backend not in _vram:
        _vram[backend] = _probe_vram(backend)
    return _vram[backend]


def _probe_vram(backend: str) -> int:
    try:
        if backend == "llamacpp":
            from .llamacpp.devices import offload_devices, supports_gpu_offload

            return sum(d.total for d in offload_devices()) if supports_gpu_offload() else 0
        if backend == "torch":
            import torch

            return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else 0
        if backend == "mlx":
            import mlx.core as mx

            return int(mx.metal.device_info().get("max_recommended_working_set_size", 0)) if mx.metal.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver means no GPU to size for, not a failed load
        import logging

        logging.getLogger(__name__).warning("could not read %s's GPU memory", backend, exc_info=True)
    return 0
