"""Validate a GGUF file before llama.cpp sees it and fill ModelInfo from its header.

llama.cpp returns NULL for many bad files but aborts the process on others, so the header is parsed first (by
`common.gguf_file`, which checks the magic, every bound and that the tensor data is all there) and its generic
hyperparameters checked (`common.gguf_checks`): a `ModelLoadError` names what is wrong. Token lists and merges are left in the file (lazy mode), so this costs milliseconds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ..base import ModelInfo, ModelLoadError
from ..common.gguf_checks import check_hparams
from ..common.gguf_file import GGUFArray, GGUFFile, GGUFTensor
from ..common.gguf_file import file_type_name as _file_type_name

MAX_ARRAY_KEPT = 1024  # arrays longer than this (token lists, merges) are skipped, not materialised


@dataclass
class GGUFHeader:
    """Metadata key/values (large arrays as None) and the tensor table of a GGUF file."""

    path: str
    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensor] = field(default_factory=list)
    skipped_arrays: dict[str, int] = field(default_factory=dict)  # key -> element count


def read_header(path: str) -> GGUFHeader:
    """Parse and validate a GGUF file; raise ModelLoadError naming the file and the reason."""
    if os.path.isdir(path):
        raise ModelLoadError(f"{path}: is a directory; the llama.cpp backend loads a single GGUF file")
    if not os.path.isfile(path):
        raise ModelLoadError(f"{path}: no such model file")
    size = os.path.getsize(path)
    if size < 24:
        raise ModelLoadError(f"{path}: not a GGUF file (only {size} bytes)")
    with GGUFFile(path, lazy_arrays_over=MAX_ARRAY_KEPT) as gf:
        header = GGUFHeader(path, gf.version, {}, list(gf.tensors.values()))
        for key, value in gf.metadata.items():
            if isinstance(value, GGUFArray):
                header.skipped_arrays[key] = len(value)
                value = None
            header.metadata[key] = value
        check_hparams(gf.metadata, path)  # before the lazy arrays close: per-layer counts may be among them
    return header


def file_type_name(header: GGUFHeader) -> str:
    """Ollama's quantization level: F32, F16, Q8_0, Q4_K_M, ... from general.file_type or the tensors."""
    return _file_type_name(header.metadata, header.tensors) or "unknown"


def model_info(header: GGUFHeader, vocab_size: int, parameter_count: int) -> ModelInfo:
    """ModelInfo from the `{arch}.*` keys; the full (array-trimmed) metadata goes to /api/show."""
    md = header.metadata
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelLoadError(f"{header.path}: GGUF has no general.architecture key")

    def key(name: str, default: int = 0) -> int:
        v = md.get(f"{arch}.{name}", default)  # a per-layer list (hybrid models: 0 on recurrent layers): its largest
        return int(max(v) if isinstance(v, list) and v else v or default)

    heads = key("attention.head_count")
    shown = {k: v for k, v in md.items() if v is not None}
    for k, n in header.skipped_arrays.items():
        shown[k] = None  # present but not shown, like Ollama's non-verbose model_info
    shown["general.parameter_count"] = parameter_count
    return ModelInfo(
        architecture=arch,
        vocab_size=vocab_size,
        context_length=key("context_length", 2048),
        embedding_length=key("embedding_length"),
        block_count=key("block_count"),
        head_count=heads,
        head_count_kv=key("attention.head_count_kv", heads),
        parameter_count=parameter_count,
        file_type=file_type_name(header),
        metadata=shown,
    )


def key_head_dim(info: ModelInfo, header: GGUFHeader) -> int:
    """Width of one attention head's key."""
    md = header.metadata
    return int(md.get(f"{info.architecture}.attention.key_length", 0) or (info.embedding_length // max(info.head_count, 1)))


def is_mla(header: GGUFHeader) -> bool:
    """Multi-head latent attention (DeepSeek-V2/V3 and kin): one compressed KV row per token."""
    arch = header.metadata.get("general.architecture")
    return f"{arch}.attention.kv_lora_rank" in header.metadata


def kv_bytes_per_token(info: ModelInfo, header: GGUFHeader, bytes_per_elem: float = 2) -> int:
    """Approximate KV-cache bytes per token (K and V, all layers) for sizing the context: per layer, as the KV heads
    count them (a hybrid model's recurrent layers have none: their state is one per sequence, not per token); an MLA
    model (DeepSeek) keeps one latent row per token, its K, and reads V from it."""
    md, arch = header.metadata, info.architecture
    heads = md.get(f"{arch}.attention.head_count_kv")
    per_layer = [int(h) for h in heads] if isinstance(heads, list) and len(heads) == info.block_count \
        else [info.head_count_kv] * info.block_count
    interval = md.get(f"{arch}.full_attention_interval")  # Qwen3.5 / Qwen3-Next: attention every N-th layer only
    if isinstance(interval, int) and interval > 0:
        per_layer = [h if (i + 1) % interval == 0 else 0 for i, h in enumerate(per_layer)]
    k = key_head_dim(info, header)
    v = 0 if is_mla(header) else int(md.get(f"{arch}.attention.value_length", 0) or k)
    return round(sum(per_layer) * (k + v) * bytes_per_elem)
