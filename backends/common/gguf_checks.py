"""Hyperparameter checks on a GGUF header, before llama.cpp sees the file.

llama.cpp asserts on some header values instead of returning an error: a block count outside 1..512 aborts
the whole process (`GGML_ASSERT(n_layer > 0 && n_layer <= LLAMA_MAX_LAYERS)`), and so do expert counts that do
not add up. These are the generic keys every architecture reads (`llama_model::load_hparams`), checked with their
types and per-layer lengths; architecture-specific asserts are left to the load probe
(`backends/llamacpp/load_probe.py`). Run at /api/create and at every load.
"""
from __future__ import annotations

from typing import Any

from ..base import ModelLoadError

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 512  # LLAMA_MAX_EXPERTS
MAX_WIDTH = 1 << 20  # embedding/ffn/head widths: far above any real model, far below an int32 overflow
MAX_CONTEXT = 1 << 30  # context_length: llama.cpp keeps it in a uint32; real models stop at a few million


def _count(md: dict[str, Any], key: str, source: str, lo: int, hi: int, required: bool = False) -> int | None:
    """The integer value of `key` within [lo, hi]; None when absent and not required."""
    if key not in md:
        if required:
            raise ModelLoadError(f"{source}: GGUF metadata has no {key!r}")
        return None
    v = md[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelLoadError(f"{source}: GGUF metadata {key!r} is {_show(v)}; expected an integer in {lo}..{hi}")
    if not lo <= v <= hi:
        raise ModelLoadError(f"{source}: GGUF metadata {key!r} is {v}; allowed: {lo}..{hi}")
    return v


def _per_layer(md: dict[str, Any], key: str, source: str, n_layer: int, lo: int, hi: int) -> list[int] | None:
    """A count that is one integer or one per layer (llama.cpp's get_key_or_arr), as a per-layer list."""
    if key not in md:
        return None
    v = md[key]
    if isinstance(v, int) and not isinstance(v, bool):
        _count(md, key, source, lo, hi)
        return [v] * n_layer
    if not hasattr(v, "__len__") or isinstance(v, (str, bytes)):
        raise ModelLoadError(f"{source}: GGUF metadata {key!r} is {_show(v)}; expected an integer or one per layer")
    if len(v) != n_layer:
        raise ModelLoadError(f"{source}: GGUF metadata {key!r} has {len(v)} values for {n_layer} layers")
    values = v.tolist() if hasattr(v, "tolist") else list(v)  # a lazy GGUFArray of at most MAX_LAYERS numbers
    for i, x in enumerate(values):
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise ModelLoadError(f"{source}: GGUF metadata {key!r}[{i}] is {_show(x)}; allowed: {lo}..{hi}")
    return values


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# The vocabulary arrays and the type of their elements (GGUF value types). llama.cpp reads token_type and
# scores as plain C arrays indexed by token id, whatever their stored length.
_VOCAB_ARRAYS = {"tokenizer.ggml.tokens": (8,), "tokenizer.ggml.merges": (8,), "tokenizer.ggml.token_type": (5, 4),
                 "tokenizer.ggml.scores": (6,)}
_TYPE_NAMES = {4: "uint32", 5: "int32", 6: "float32", 8: "string"}


def _element_types(v: Any) -> set[str]:
    """The Python types of an array's elements (a lazy GGUFArray answers from its stored element type)."""
    etype = getattr(v, "etype", None)
    if etype is not None:
        return {{8: "str", 6: "float", 12: "float"}.get(etype, "int")}
    return {"float" if isinstance(x, float) else "int" if isinstance(x, int) and not isinstance(x, bool)
            else type(x).__name__ for x in v}


def check_vocab(md: dict[str, Any], source: str) -> None:
    """The tokenizer arrays, when present, are arrays of the right element type, one entry per token."""
    want = {"tokenizer.ggml.tokens": "str", "tokenizer.ggml.merges": "str", "tokenizer.ggml.token_type": "int",
            "tokenizer.ggml.scores": "float"}
    n_tokens = None
    for key, kind in want.items():
        if key not in md or md[key] is None:  # None: an array gguf_info left in the file (over 1024 entries)
            continue
        v = md[key]
        if isinstance(v, (str, bytes)) or not hasattr(v, "__len__") or not _element_types(v) <= {kind}:
            raise ModelLoadError(f"{source}: GGUF metadata {key!r} must be an array of "
                                 f"{_TYPE_NAMES[_VOCAB_ARRAYS[key][0]]}")
        if key == "tokenizer.ggml.tokens":
            n_tokens = len(v)
            if n_tokens == 0:
                raise ModelLoadError(f"{source}: GGUF metadata 'tokenizer.ggml.tokens' is empty")
        elif key != "tokenizer.ggml.merges" and n_tokens is not None and len(v) != n_tokens:
            raise ModelLoadError(f"{source}: GGUF metadata {key!r} has {len(v)} entries for {n_tokens} tokens")
    for key in ("tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        if key in md and md[key] is not None and "tokenizer.ggml.tokens" not in md:
            raise ModelLoadError(f"{source}: GGUF metadata {key!r} without 'tokenizer.ggml.tokens'")


def check_hparams(md: dict[str, Any], source: str) -> None:
    """ModelLoadError naming the key when a generic hyperparameter would make llama.cpp assert or divide by 0,
    or a vocabulary array is not one entry per token.

    A file without `general.architecture` is left alone (llama.cpp refuses it cleanly)."""
    check_vocab(md, source)
    arch = md.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return
    n_layer = _count(md, f"{arch}.block_count", source, 1, MAX_LAYERS)
    _count(md, f"{arch}.context_length", source, 1, MAX_CONTEXT)
    n_embd = _count(md, f"{arch}.embedding_length", source, 1, MAX_WIDTH)
    n_expert = _count(md, f"{arch}.expert_count", source, 0, MAX_EXPERTS) or 0
    n_used = _count(md, f"{arch}.expert_used_count", source, 0, MAX_EXPERTS) or 0
    if n_used > n_expert or (n_expert > 0) != (n_used > 0):
        raise ModelLoadError(f"{source}: GGUF metadata {arch}.expert_used_count is {n_used} with {n_expert} experts; "
                             f"it must be 1..expert_count with experts, 0 without")
    _count(md, f"{arch}.attention.key_length", source, 1, MAX_WIDTH)
    _count(md, f"{arch}.attention.value_length", source, 1, MAX_WIDTH)
    if n_layer is None:
        return
    # Per-layer counts must have one value per layer (llama.cpp refuses other lengths; torch indexes by layer).
    # Zero heads are left alone: hybrid models (Jamba, Falcon-H1) have layers without attention, and llama.cpp
    # refuses a plain model with none cleanly.
    _per_layer(md, f"{arch}.feed_forward_length", source, n_layer, 0, MAX_WIDTH)
    _per_layer(md, f"{arch}.attention.head_count", source, n_layer, 0, MAX_WIDTH)
    _per_layer(md, f"{arch}.attention.head_count_kv", source, n_layer, 0, MAX_WIDTH)
