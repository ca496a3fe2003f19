"""Backend-neutral model loading (no torch, no mlx): ModelArgs, GGUF/HF readers and tokenizers."""
from .config import SUPPORTED_ARCHITECTURES, ModelArgs, ModelFiles, build_model_info

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelArgs", "ModelFiles", "build_model_info", "open_model"]


def open_model(path: str):
    """Open a GGUF file (by its magic bytes) or an HF directory; returns a GGUFModel or an HFModel."""
    import os

    from ..base import ModelLoadError
    from .gguf_file import is_gguf

    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file or directory")
    if is_gguf(path):
        from .gguf_model import GGUFModel

        return GGUFModel(path)
    from .hf_model import HFModel

    return HFModel(path)
