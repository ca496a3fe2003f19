"""The MLX backend: Metal on Apple Silicon, MLX's CPU build elsewhere (for tests; `auto` picks it on Apple Silicon).

Registered here with what it can do; importing this package does not import mlx.
"""
from ..registry import LLAMA_DECODERS, BackendSpec, register_backend


def _load(model_path: str, settings):
    from .runner import load

    return load(model_path, settings)


def _probe_vram() -> int:
    """Metal's recommended working set."""
    import mlx.core as mx

    return int(mx.metal.device_info().get("max_recommended_working_set_size", 0)) if mx.metal.is_available() else 0


register_backend(BackendSpec(
    name="mlx", package="mlx", title="MLX", load=_load, probe_vram=_probe_vram, formats=("gguf", "safetensors"),
    architectures=LLAMA_DECODERS, preference=1, apple_silicon_only=True))
