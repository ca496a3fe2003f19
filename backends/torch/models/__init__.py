"""The torch model and its loading: `build_model` creates the decoder and fills its weights by HF name.

Every supported architecture (common.model_args.SUPPORTED_ARCHITECTURES) is the Llama decoder of llama.py with the
flags ModelArgs sets for its family (qwen2: q/k/v biases, qwen3: q/k norms).
"""
from __future__ import annotations

import logging
from typing import Iterable

import numpy as np
import torch
from torch import nn

from ...common.checkpoint import IGNORED_SUFFIXES, check_complete, check_shape
from ...common.model_args import ModelArgs, check_architecture
from . import llama

log = logging.getLogger(__name__)


def build_model(args: ModelArgs, tensors: Iterable[tuple[str, np.ndarray]], device: torch.device,
                dtype: torch.dtype, source: str) -> llama.Model:
    """Create the decoder on `device`/`dtype` and fill every parameter from `tensors` (HF names)."""
    check_architecture(args.model_type, source)
    with torch.device("meta"):  # no random init: every parameter is replaced by a loaded tensor
        model = llama.Model(args)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    rope_factors = None
    for name, arr in tensors:
        if name == "rope_freqs":
            rope_factors = np.array(arr, dtype=np.float32)
            continue
        if name not in params:
            if not name.endswith(IGNORED_SUFFIXES) and not (name == "lm_head.weight" and args.tie_word_embeddings):
                log.warning("%s: ignoring unexpected weight %r", source, name)
            continue
        p = params[name]
        check_shape(source, name, arr.shape, p.shape)
        if not arr.flags.writeable:  # mmapped file data: torch wants a writable buffer
            arr = np.array(arr)
        t = torch.from_numpy(arr).to(device=device, dtype=dtype)
        module_name, _, pname = name.rpartition(".")
        model.get_submodule(module_name)._parameters[pname] = nn.Parameter(t, requires_grad=False)
        loaded.add(name)
    if "lm_head.weight" not in loaded and "model.embed_tokens.weight" in loaded:
        model.lm_head.weight = model.model.embed_tokens.weight  # tied embeddings
        loaded.add("lm_head.weight")
    check_complete(source, params, loaded)
    model.inv_freq = llama.rope_inv_freq(args, rope_factors).to(device)  # float32: positions need the precision
    return model.eval()
