"""Which backend serves a model: chosen per model (its file format and architecture) and per machine, as Ollama does.

What each backend reads and runs is its own declaration (registry.py); `auto` takes the most preferred installed
backend that runs the model: a GGUF on llama.cpp everywhere (every architecture a GGUF carries, offloaded to a GPU
where the build can), an HF safetensors folder on MLX on Apple Silicon, else torch (CUDA when it sees a GPU, else the
CPU). `choose_backend` is pure; `probe_machine` gathers the facts.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import platform
import struct
from dataclasses import dataclass

from .registry import FORMAT_NAMES, BackendSpec, backend_spec, specs

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"


def runs(backend: str, architecture: str | None) -> bool:
    """Whether `backend` runs models of `architecture` (an unknown one: left to the loader)."""
    return backend_spec(backend).runs(architecture)


def backends_for(architecture: str | None, fmt: str = "unknown") -> list[str]:
    """The backends that run `architecture` from a model file of format `fmt`, `auto`'s preferred first."""
    return [s.name for s in specs() if s.runs(architecture) and s.reads(fmt)]


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
    """Why `backend` cannot run the model (its file format, or its architecture: and the backends that run it), None
    when it can."""
    spec = backend_spec(backend)
    fmt = model_format(model_path)
    if not spec.reads(fmt):
        return (f"{model_path}: the {backend} backend reads {spec.describe_formats()}, not {FORMAT_NAMES[fmt]}; "
                f"{', '.join(backends_for(None, fmt))} read it (EVENFLOW_BACKEND=auto picks one)")
    arch = gguf_architecture(model_path) if spec.architectures is not None else None
    if spec.runs(arch):
        return None
    return (f"{model_path}: the {backend} backend does not run architecture {arch!r} (it runs "
            f"{', '.join(spec.architectures or ())}); {arch} runs on: {', '.join(backends_for(arch))} "
            f"(EVENFLOW_BACKEND=auto picks it for a GGUF)")


@dataclass(frozen=True)
class Machine:
    """What this machine offers the backends."""

    apple_silicon: bool
    installed: frozenset[str]  # the backends whose package is installed (torch then picks CUDA when it sees a GPU)

    def fits(self, spec: BackendSpec) -> bool:
        return self.apple_silicon or not spec.apple_silicon_only


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
    """The backend for a model of format `fmt` (and `architecture`, where known) on `machine`: the most preferred
    installed one that runs it, else the one that would (its loader names its missing package), else an installed one
    (its loader says what it cannot read)."""
    here = [s for s in specs() if machine.fits(s)]
    fit = [s for s in here if s.reads(fmt) and s.runs(architecture)]
    for candidates in ([s for s in fit if s.name in machine.installed], fit,
                       [s for s in here if s.name in machine.installed], here):
        if candidates:
            return candidates[0].name
    raise ValueError("no backend is registered")


def probe_machine() -> Machine:
    """Installed packages (no import: a GGUF must not wait for torch to load)."""
    apple = platform.system() == "Darwin" and platform.machine() == "arm64"
    return Machine(apple_silicon=apple, installed=frozenset(
        s.name for s in specs() if importlib.util.find_spec(s.package) is not None))


_vram: dict[str, int] = {}


def total_vram(backend: str) -> int:
    """Total memory of the GPU(s) `backend` would use (0 without one; its `BackendSpec.probe_vram`): Ollama's default
    window keys on it. Cached per process."""
    if backend not in _vram:
        try:
            _vram[backend] = int(backend_spec(backend).probe_vram())
        except Exception:  # noqa: BLE001 - a broken driver means no GPU to size for, not a failed load
            log.warning("could not read %s's GPU memory", backend, exc_info=True)
            _vram[backend] = 0
    return _vram[backend]
