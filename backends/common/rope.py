"""RoPE inverse frequencies with linear or llama3 scaling, or GGUF `rope_freqs` factors: numpy, float32.

Shared by the torch and MLX models; each applies the rotation (HF's rotate-half layout) with its own arrays.
"""
from __future__ import annotations

import math

import numpy as np

from .model_args import ModelArgs


def base_inv_freq(args: ModelArgs) -> np.ndarray:
    """Unscaled inverse frequencies theta^(-2i/head_dim), [head_dim/2] float32."""
    dim = int(args.head_dim or 0)
    return (1.0 / (args.rope_theta ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / dim))).astype(np.float32)


def rope_inv_freq(args: ModelArgs, freq_factors: np.ndarray | None = None, inv: np.ndarray | None = None) -> np.ndarray:
    """Inverse frequencies [head_dim/2] (float32) with linear or llama3 scaling, or GGUF rope_freqs factors.

    `inv`: the unscaled frequencies where a backend computes them its own way (torch: with torch's float32 pow,
    which is what transformers uses, bit for bit; numpy's differs in the last bit); default `base_inv_freq`."""
    inv = base_inv_freq(args) if inv is None else np.asarray(inv, dtype=np.float32)
    if freq_factors is not None:  # GGUF stores llama3 scaling as per-frequency divisors
        return (inv / np.asarray(freq_factors, dtype=np.float32)).astype(np.float32)
    sc = args.rope_scaling
    if not sc:
        return inv
    kind = sc.get("rope_type", sc.get("type"))
    factor = float(sc.get("factor", 1.0))
    if kind == "linear":
        return (inv / factor).astype(np.float32)
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend in between.
    low, high = float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
    old_ctx = float(sc.get("original_max_position_embeddings", 8192))
    # scalar / array as torch computes it (scalar * reciprocal): the frequencies transformers uses, bit for bit
    wavelen = 2 * math.pi * np.reciprocal(inv)
    scaled = np.where(wavelen > old_ctx / low, inv / factor, inv)
    smooth = (old_ctx * np.reciprocal(wavelen) - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_ctx / high) & ~(wavelen > old_ctx / low)
    return np.where(medium, blended, scaled).astype(np.float32)
