"""Model runners behind one contract (`base.py`). Each backend registers lazily so that importing
evenflow never imports torch, mlx or llama_cpp until a model is loaded with that backend."""
import importlib

from .base import register_backend


def _loader(module: str):
    return lambda: importlib.import_module(f"evenflow.backends.{module}").load


register_backend("torch", _loader("torch.runner"))
register_backend("mlx", _loader("mlx.runner"))
register_backend("llamacpp", _loader("llamacpp.runner"))
