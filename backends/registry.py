"""What each backend can do, declared once by its own package (`BackendSpec`, registered in its `__init__`).

Choosing a backend (choice.py), loading (`base.load_runner`) and the daemon's model manager read these declarations
instead of switching on a backend's name. Nothing here imports torch, mlx or llama_cpp: the loader and the VRAM
probe of a spec import their backend only when called.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

# The Llama decoder family torch and MLX implement themselves (common/model_args.py, backends/*/models/llama.py);
# llama.cpp also runs the sliding-window (gemma3, gpt-oss), MoE (qwen3moe, gpt-oss, deepseek2), MLA (deepseek2) and
# hybrid recurrent (lfm2, qwen35, ...) families, which reach torch and MLX never.
LLAMA_DECODERS = ("llama", "mistral", "qwen2", "qwen3")
FORMAT_NAMES = {"gguf": "a GGUF file", "safetensors": "a safetensors folder"}  # choice.model_format's words


@dataclass(frozen=True)
class BackendSpec:
    """One backend: the model files and architectures it runs, the load-time options it honours, how it loads."""

    name: str  # EVENFLOW_BACKEND's word for it
    package: str  # the Python package it needs (`auto` looks for it without importing it)
    title: str  # its name in prose ("llama.cpp")
    # (model_path, RunnerSettings) -> Runner; imports the backend's heavy modules on the first call
    load: Callable[[str, Any], Any]
    # total memory of the GPU(s) the backend would use, 0 without one; imports the backend (called once per process)
    probe_vram: Callable[[], int]
    formats: tuple[str, ...]  # model files it reads: "gguf" (one file), "safetensors" (an HF folder)
    architectures: tuple[str, ...] | None  # GGUF general.architecture values it runs; None = every one its build knows
    # `auto` prefers lower values where several backends run a model (llama.cpp for a GGUF, MLX on Apple Silicon)
    preference: int
    apple_silicon_only: bool = False  # `auto` picks it on Apple Silicon only (MLX: its Linux CPU build is for tests)
    vision: bool = False  # runs a vision projector beside the model (RunnerSettings.projector_path: images in)
    kv_cache_types: tuple[str, ...] = ("auto", "f16")  # the OLLAMA_KV_CACHE_TYPE values it honours
    draft_model: bool = False  # runs a draft model (Modelfile DRAFT) beside the model, on this backend too
    rollback: bool = True  # takes draft tokens back (`Runner.rollback`) for a plain transformer: speculative decoding
    # The device name of GPU N where Ollama's num_gpu 0 / main_gpu N pick the `device` setting (torch: "cuda:{}");
    # None: the backend reads num_gpu / main_gpu itself (llama.cpp) or has one GPU (MLX)
    gpu_device: str | None = None

    def reads(self, fmt: str) -> bool:
        """Whether it reads model files of format `fmt` ("unknown": left to the loader)."""
        return fmt == "unknown" or fmt in self.formats

    def runs(self, architecture: str | None) -> bool:
        """Whether it runs models of `architecture` (an unknown one: left to the loader)."""
        return self.architectures is None or architecture is None or architecture in self.architectures

    def describe_formats(self) -> str:
        return " or ".join(FORMAT_NAMES.get(f, f) for f in self.formats)


_SPECS: dict[str, BackendSpec] = {}


def register_backend(spec: BackendSpec) -> None:
    """Declare a backend (each backend package does, once, in its `__init__`)."""
    _SPECS[spec.name] = spec


def backend_names() -> list[str]:
    return sorted(_SPECS)


def specs() -> list[BackendSpec]:
    """Every registered backend, `auto`'s preferred first."""
    return sorted(_SPECS.values(), key=lambda s: (s.preference, s.name))


def backend_spec(name: str) -> BackendSpec:
    """The named backend's declaration; ValueError naming those there are for an unknown name."""
    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; available: {', '.join(backend_names())}") from None
