"""The PyTorch backend: GGUF files and HF folders of the Llama decoder family, on CUDA, MPS or the CPU.

Registered here with what it can do; importing this package does not import torch.
"""
from ..registry import LLAMA_DECODERS, BackendSpec, register_backend


def _load(model_path: str, settings):
    from .runner import load

    return load(model_path, settings)


def _probe_vram() -> int:
    """CUDA device 0's memory."""
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else 0


register_backend(BackendSpec(
    name="torch", package="torch", title="torch", load=_load, probe_vram=_probe_vram, formats=("gguf", "safetensors"),
    architectures=LLAMA_DECODERS, preference=2, gpu_device="cuda:{}"))
