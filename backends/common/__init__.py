"""Backend-neutral model loading (no torch, no mlx): ModelArgs, GGUF/HF readers and tokenizers."""
from .model_args import SUPPORTED_ARCHITECTURES, ModelArgs, ModelFiles, build_model_info

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelArgs", "ModelFiles", "build_model_info", "open_model"]


def open_model(path: str):
    """Open a GGUF file (by its magic bytes) or an HF directory; returns a GGUFModel or an HFModel."""
    import os

    from ..base import ModelLoadError
    from .gguf_file import is_gguf

    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file or directory")
    try:
        if is_gguf(path):
            from .gguf_model import GGUFModel

            return GGUFModel(path)
        from .hf_model import HFModel

        return HFModel(path)
    except ModelLoadError:
        raise
    except Exception as e:  # noqa: BLE001
        # Everything above reads files a client uploaded: a value of the wrong type or size that slipped past the
        # checks is still the file's fault, so a clear ModelLoadError (400), not an internal error (500). The
        # tokenizers library raises plain Exceptions for a vocabulary it cannot build (a merge of unknown tokens).
        import logging

        logging.getLogger(__name__).debug("reading %s failed", path, exc_info=True)
        raise ModelLoadError(f"{path}: invalid model file ({type(e).__name__}: {str(e)[:200]})") from None
