"""The MLX model and its loading: `build_model` creates the decoder and fills its weights by HF name (maybe quantised).

Every supported architecture (common.model_args.SUPPORTED_ARCHITECTURES) is the Llama decoder of llama.py with the
flags ModelArgs sets for its family (qwen2: q/k/v biases, qwen3: q/k norms).
"""
from __future__ import annotations

import logging

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...base import ModelLoadError
from ...common.checkpoint import IGNORED_SUFFIXES, check_complete, check_shape
from ...common.model_args import ModelArgs, check_architecture
from . import llama

log = logging.getLogger(__name__)

QUANT_PARTS = (".scales", ".biases")


def _quant_params(model: nn.Module, weights: dict[str, mx.array], mode: str, source: str) -> dict[str, dict]:
    """{module path: {group_size, bits, mode}} for every module whose weights arrive quantised (`.scales` present).

    Bits and group size come from the packed shapes, so per-layer mixes (GGUF Q4_0 + Q8_0, mlx-lm's mixed
    recipes) need no config: bits = 32 * packed_cols / in_features, group = in_features / scale_cols.
    """
    modules = dict(model.named_modules())
    out: dict[str, dict] = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        path = name[: -len(".scales")]
        mod, packed = modules.get(path), weights.get(path + ".weight")
        if mod is None or packed is None or not hasattr(mod, "to_quantized"):
            raise ModelLoadError(f"{source}: quantised tensor {name!r} matches no quantisable layer")
        in_features = int(mod.weight.shape[-1])
        bits = 32 * int(packed.shape[-1]) // in_features
        group = in_features // int(scales.shape[-1])
        if packed.dtype != mx.uint32 or bits not in (2, 3, 4, 5, 6, 8) or group * int(scales.shape[-1]) != in_features:
            raise ModelLoadError(f"{source}: cannot read quantisation of {path!r} (packed {packed.shape} "
                                 f"{packed.dtype}, scales {scales.shape}, in_features {in_features})")
        out[path] = {"group_size": group, "bits": bits, "mode": mode}
    return out


def build_model(args: ModelArgs, weights: dict[str, mx.array], dtype: mx.Dtype, source: str,
                quant_mode: str = "affine") -> llama.Model:
    """Create the decoder in `dtype` and fill every parameter from `weights` (HF names, maybe quantised)."""
    check_architecture(args.model_type, source)
    model = llama.Model(args)  # random init stays lazy: every parameter is replaced below
    rope = weights.pop("rope_freqs", None)
    if rope is not None:
        model.set_rope_factors(np.array(rope.astype(mx.float32)))
    if args.tie_word_embeddings:
        for part in ("weight",) + tuple(p[1:] for p in QUANT_PARTS):
            weights.pop(f"lm_head.{part}", None)  # a tied checkpoint may still store a copy
    quant = _quant_params(model, weights, quant_mode, source)
    if quant:
        nn.quantize(model, class_predicate=lambda path, _m: quant.get(path, False))
    expected = dict(nn.utils.tree_flatten(model.parameters()))
    items: list[tuple[str, mx.array]] = []
    for name, arr in weights.items():
        if name not in expected:
            if not name.endswith(IGNORED_SUFFIXES):
                log.warning("%s: ignoring unexpected weight %r", source, name)
            continue
        check_shape(source, name, arr.shape, expected[name].shape)
        if mx.issubdtype(arr.dtype, mx.floating):
            arr = arr.astype(dtype)  # scales/biases too: a QuantizedLinear computes in its scales' dtype
        items.append((name, arr))
    check_complete(source, expected, (n for n, _ in items))
    model.load_weights(items, strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model
