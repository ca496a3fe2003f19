"""`auto` picks the backend the machine suits: CUDA torch, MLX on Apple Silicon, llama.cpp otherwise."""
from __future__ import annotations

import importlib.util
import platform

import pytest

from evenflow.backends.base import RunnerSettings, auto_backend, backend_names, load_runner


def test_registered_backends():
    assert backend_names() == ["llamacpp", "mlx", "torch"]
    with pytest.raises(ValueError, match="unknown backend 'tensorrt'; available: llamacpp, mlx, torch"):
        load_runner("tensorrt", "x.gguf", RunnerSettings())


@pytest.mark.skipif(platform.system() == "Darwin", reason="Apple Silicon picks MLX")
def test_auto_picks_llamacpp_on_a_cpu_only_machine():
    import torch

    if torch.cuda.is_available():
        assert auto_backend() == "torch"
    elif importlib.util.find_spec("llama_cpp"):
        assert auto_backend() == "llamacpp"
    else:
        assert auto_backend() == "torch"
