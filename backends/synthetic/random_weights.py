"""Random weights with Hugging Face tensor names, and the Q/K row permutation llama.cpp's RoPE layout needs."""
from __future__ import annotations

import logging
import math

import numpy as np

from .spec import ModelSpec

log = logging.getLogger(__name__)

INIT_STD = 0.02


def tensor_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape, in the fixed order weights are drawn (the order is part of determinism)."""
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.resolved_head_dim
    q, kv = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h)}
    for n in range(spec.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes[p + "input_layernorm.weight"] = (h,)
        for proj, rows in (("q", q), ("k", kv), ("v", kv)):
            shapes[p + f"self_attn.{proj}_proj.weight"] = (rows, h)
            if spec.architecture == "qwen2":
                shapes[p + f"self_attn.{proj}_proj.bias"] = (rows,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if spec.architecture == "qwen3":
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        shapes[p + "mlp.gate_proj.weight"] = (i, h)
        shapes[p + "mlp.up_proj.weight"] = (i, h)
        shapes[p + "mlp.down_proj.weight"] = (h, i)
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def is_norm(name: str) -> bool:
    """RMSNorm weights (initialised to 1.0, kept F32 in GGUF)."""
    return name.endswith(("layernorm.weight", "norm.weight"))


def build_weights(spec: ModelSpec) -> dict[str, np.ndarray]:
    """All weights as float32 arrays: normal(0, 0.02) (q/k: qk_std) from PCG64(seed) in a fixed order, norms 1.0."""
    rng = np.random.Generator(np.random.PCG64(spec.seed))
    weights: dict[str, np.ndarray] = {}
    for name, shape in tensor_shapes(spec).items():
        if is_norm(name):
            weights[name] = np.ones(shape, dtype=np.float32)
        else:
            w = rng.standard_normal(shape, dtype=np.float32)
            qk = name.endswith(("q_proj.weight", "k_proj.weight"))
            w *= np.float32(spec.qk_std if qk else INIT_STD)
            weights[name] = w
    if spec.text_only_output:
        tied = spec.tie_word_embeddings
        if tied:  # tied: the input embeddings of those tokens become zero as well
            log.warning("text_only_output with tied embeddings zeroes the input embeddings of those tokens")
        zero_non_text_rows(spec, weights[("model.embed_tokens.weight" if tied else "lm_head.weight")])
    return weights


def zero_non_text_rows(spec: ModelSpec, output: np.ndarray) -> None:
    """Zero the output rows of control, user-defined and single-byte tokens (random logits elsewhere win greedy
    decoding): HF's lm_head, or GGUF's output / tied token_embd."""
    from .tokenizer import vocab_for

    rows = np.asarray(vocab_for(spec).output_mask(), dtype=np.int64)
    output[rows[rows < spec.vocab_size]] = 0.0


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half Q/K rows -> llama.cpp's interleaved-pair layout (as convert_hf_to_gguf.py does)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `permute_qk`: GGUF llama/mistral attn_q/attn_k rows back to the HF layout."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(spec: ModelSpec) -> np.ndarray:
    """Per-frequency divisors of llama3 rope scaling: GGUF's `rope_freqs.weight` (head_dim // 2 floats)."""
    rs = spec.rope_scaling or {}
    dim = spec.resolved_head_dim
    freqs = 1.0 / (spec.rope_theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor = float(rs.get("factor", 8.0))
    low, high = float(rs.get("low_freq_factor", 1.0)), float(rs.get("high_freq_factor", 4.0))
    # transformers reads this from rope_scaling (convert_hf_to_gguf.py from the top level); equal by default
    old_ctx = float(rs.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)
