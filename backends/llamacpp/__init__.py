"""llama.cpp backend: GGUF models through llama-cpp-python's low-level API, one `llama_decode` per engine step.

Registered here with what it can do; importing this package imports neither llama_cpp nor its runner (`lib.py` is
where llama_cpp is first imported).
"""
from ..registry import BackendSpec, register_backend


def _load(model_path: str, settings):
    from .runner import load

    return load(model_path, settings)


def _probe_vram() -> int:
    """The memory of the devices it offloads to, 0 for a build that cannot offload."""
    from .devices import offload_devices, supports_gpu_offload

    return sum(d.total for d in offload_devices()) if supports_gpu_offload() else 0


register_backend(BackendSpec(
    name="llamacpp", package="llama_cpp", title="llama.cpp", load=_load, probe_vram=_probe_vram, formats=("gguf",),
    architectures=None,  # every architecture its build knows: its loader names one it does not
    preference=0, vision=True, kv_cache_types=("auto", "f16", "q8_0", "q4_0"), draft_model=True))
