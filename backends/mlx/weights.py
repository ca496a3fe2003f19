"""Weights for MLX: HF / MLX-community safetensors via `mx.load`, GGUF via `mx.load` (Q4_0/Q4_1/Q8_0 stay
quantised) with the common numpy dequantiser as a fallback. Metadata, tokenizer and template come from
`backends.common` so every backend reads a model the same way.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from ..base import ModelLoadError
from ..common.model_args import ModelFiles
from ..common.gguf_model import GGUFModel, hf_name, unpermute_qk
from ..common.hf_model import HFModel

log = logging.getLogger(__name__)

_PERMUTED_ARCHS = ("llama", "mistral")  # convert_hf_to_gguf permutes their Q/K rows


@dataclass
class LoadedWeights:
    """HF-named arrays (quantised layers as `.weight` uint32 + `.scales` + `.biases`) and what describes them."""

    files: ModelFiles
    weights: dict[str, mx.array]
    parameter_count: int
    quant_mode: str = "affine"
    quantization: dict[str, Any] = field(default_factory=dict)  # {group_size, bits} where the source declares it


def _logical_count(weights: dict[str, mx.array], bits: int) -> int:
    """Parameters as the unquantised model counts them (packed uint32 words unpacked, scales/biases left out)."""
    n = 0
    for name, arr in weights.items():
        if name.endswith((".scales", ".biases")):
            continue
        packed = arr.dtype == mx.uint32 and name.endswith(".weight") and name[:-7] + ".scales" in weights
        n += int(arr.size) * 32 // bits if packed else int(arr.size)
    return n


def load_hf(path: str) -> LoadedWeights:
    """An HF or MLX-community directory: every *.safetensors file read with `mx.load` (bf16 kept native)."""
    src = HFModel(path)
    files = src.files()
    qcfg = src.config.get("quantization") or src.config.get("quantization_config") or {}
    if qcfg and "bits" not in qcfg:
        raise ModelLoadError(f"{path}/config.json: quantization {qcfg!r} is not an MLX affine quantisation "
                             "(expected group_size and bits)")
    weights: dict[str, mx.array] = {}
    for fname in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        try:
            weights.update(mx.load(os.path.join(path, fname)))
        except (RuntimeError, ValueError) as e:
            raise ModelLoadError(f"{os.path.join(path, fname)}: cannot read safetensors ({e})") from None
    if qcfg:
        files.file_type = f"Q{qcfg['bits']}_G{qcfg.get('group_size', 64)}"  # e.g. Q4_G64, mlx-lm's recipe
    count = _logical_count(weights, int(qcfg.get("bits", 32)))
    return LoadedWeights(files, weights, count, str(qcfg.get("mode", "affine")),
                         {k: qcfg[k] for k in ("group_size", "bits") if k in qcfg})


def _row_perm(rows: int, n_head: int) -> mx.array:
    return mx.array(unpermute_qk(np.arange(rows)[:, None], n_head)[:, 0].astype(np.int32))


def _gguf_with_mx(src: GGUFModel) -> dict[str, mx.array]:
    """GGUF tensors via mx.load: Q4_0/Q4_1/Q8_0 arrive as MLX affine (weight/scales/biases), others as float."""
    raw = mx.load(src.path)
    args = src.args
    heads = {"attn_q": args.num_attention_heads, "attn_k": int(args.num_key_value_heads or args.num_attention_heads)}
    out: dict[str, mx.array] = {}
    for name, arr in raw.items():
        base, _, part = name.rpartition(".")
        if part in ("scales", "biases"):
            target = hf_name(base + ".weight")
            target = target[: -len(".weight")] + "." + part if target else None
        else:
            target = hf_name(name)
        if target is None:
            log.warning("%s: ignoring unknown tensor %r", src.path, name)
            continue
        kind = base.split(".")[-1] if base.startswith("blk.") else ""
        if src.arch in _PERMUTED_ARCHS and kind in heads:
            arr = mx.take(arr, _row_perm(int(arr.shape[0]), heads[kind]), axis=0)  # rows of weight/scales/biases
        out[target] = arr
    return out


def load_gguf(path: str) -> LoadedWeights:
    """A GGUF file; falls back to the common numpy dequantiser for tensor types `mx.load` cannot read."""
    src = GGUFModel(path)
    files = src.files()
    try:
        weights = _gguf_with_mx(src)
    except (RuntimeError, ValueError) as e:
        log.info("%s: mx.load cannot read this GGUF (%s); dequantising with numpy", path, e)
        weights = {name: mx.array(arr) for name, arr in src.iter_tensors()}
    count = src.parameter_count
    src.close()
    return LoadedWeights(files, weights, count)


def load_weights(path: str) -> LoadedWeights:
    """A GGUF file (by magic bytes) or an HF directory."""
    from ..common.gguf_file import is_gguf

    if not os.path.exists(path):
        raise ModelLoadError(f"{path}: no such file or directory")
    return load_gguf(path) if is_gguf(path) else load_hf(path)
