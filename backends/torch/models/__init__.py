"""One small file per model family (mlx-lm style); `build_model` creates one and loads its weights by HF name."""
from __future__ import annotations

import logging
from typing import Iterable

import numpy as np
import torch
from torch import nn

from ...base import ModelLoadError
from ...common.config import ModelArgs, check_architecture
from . import llama, qwen2, qwen3

log = logging.getLogger(__name__)

MODEL_CLASSES: dict[str, type[llama.Model]] = {
    "llama": llama.Model,
    "mistral": llama.Model,
    "qwen2": qwen2.Model,
    "qwen3": qwen3.Model,
}
# HF checkpoints sometimes carry these; they are recomputed, not loaded.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(args: ModelArgs, tensors: Iterable[tuple[str, np.ndarray]], device: torch.device,
                dtype: torch.dtype, source: str) -> llama.Model:
    """Create the family's model on `device`/`dtype` and fill every parameter from `tensors` (HF names)."""
    check_architecture(args.model_type, source)
    with torch.device("meta"):  # no random init: every parameter is replaced by a loaded tensor
        model = MODEL_CLASSES[args.model_type](args)
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    rope_factors = None
    for name, arr in tensors:
        if name == "rope_freqs":
            rope_factors = torch.from_numpy(np.array(arr, dtype=np.float32))
            continue
        if name not in params:
            if not name.endswith(_IGNORED_SUFFIXES) and not (name == "lm_head.weight" and args.tie_word_embeddings):
                log.warning("%s: ignoring unexpected weight %r", source, name)
            continue
        p = params[name]
        if tuple(arr.shape) != tuple(p.shape):
            raise ModelLoadError(f"{source}: weight {name!r} has shape {tuple(arr.shape)}, expected {tuple(p.shape)}")
        if not arr.flags.writeable:  # mmapped file data: torch wants a writable buffer
            arr = np.array(arr)
        t = torch.from_numpy(arr).to(device=device, dtype=dtype)
        module_name, _, pname = name.rpartition(".")
        model.get_submodule(module_name)._parameters[pname] = nn.Parameter(t, requires_grad=False)
        loaded.add(name)
    if "lm_head.weight" not in loaded and "model.embed_tokens.weight" in loaded:
        model.lm_head.weight = model.model.embed_tokens.weight  # tied embeddings
        loaded.add("lm_head.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ModelLoadError(f"{source}: missing weights {', '.join(missing[:6])}"
                             + (f" and {len(missing) - 6} more" if len(missing) > 6 else ""))
    model.inv_freq = llama.rope_inv_freq(args, rope_factors).to(device)  # float32: positions need the precision
    return model.eval()
