"""Llama / Mistral decoder in mlx.nn (Qwen2/Qwen3 too: ModelArgs' flags), over flattened tokens.

Module and parameter names equal HF's (`model.layers.N.self_attn.q_proj.weight`, ...) and mlx-lm's, so HF,
MLX-community (quantised: `.scales`/`.biases`) and GGUF weights all load by name. Every activation is
[T, ...] over the flattened mixed batch: each linear runs once per step over all tokens.
"""
from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ...common.model_args import ModelArgs
from ...common.rope import rope_inv_freq
from ..attention import StepAttention, paged_attention
from ..paged_kv import PagedKVCache


def rope_cos_sin(inv_freq: mx.array, positions: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
    """cos/sin [T, 1, head_dim] for HF's rotate-half (NeoX) layout; angles in float32 for long positions."""
    freqs = positions.astype(mx.float32)[:, None] * inv_freq[None, :]
    emb = mx.concatenate([freqs, freqs], axis=-1)
    return mx.cos(emb).astype(dtype)[:, None, :], mx.sin(emb).astype(dtype)[:, None, :]


def apply_rope(x: mx.array, cos: mx.array, sin: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    rotated = mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = mx.ones((dim,))
        self.eps = eps

    def __call__(self, x: mx.array) -> mx.array:
        return mx.fast.rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        h, hd = args.hidden_size, int(args.head_dim or 0)
        self.n_heads, self.n_kv, self.head_dim = args.num_attention_heads, int(args.num_key_value_heads or 0), hd
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(h, self.n_heads * hd, bias=args.attention_bias)
        self.k_proj = nn.Linear(h, self.n_kv * hd, bias=args.attention_bias)
        self.v_proj = nn.Linear(h, self.n_kv * hd, bias=args.attention_bias)
        self.o_proj = nn.Linear(self.n_heads * hd, h, bias=False)
        self.qk_norm = args.qk_norm
        if args.qk_norm:
            self.q_norm = RMSNorm(hd, args.rms_norm_eps)
            self.k_norm = RMSNorm(hd, args.rms_norm_eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, meta: StepAttention, kv: PagedKVCache | None,
                 layer: int) -> mx.array:
        t = x.shape[0]
        q = self.q_proj(x).reshape(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).reshape(t, self.n_kv, self.head_dim)
        v = self.v_proj(x).reshape(t, self.n_kv, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = paged_attention(q, k, v, kv, layer, meta, self.scale)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def __call__(self, x: mx.array, cos: mx.array, sin: mx.array, meta: StepAttention, kv: PagedKVCache | None,
                 layer: int) -> mx.array:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, kv, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """`model.*` in HF naming: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [DecoderLayer(args) for _ in range(args.num_hidden_layers)]
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Model(nn.Module):
    """A causal LM: `hidden()` runs every layer over the flattened batch, `logits()` only the needed rows."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = DecoderStack(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self._inv_freq = mx.array(rope_inv_freq(args))  # underscore: not a parameter, never loaded

    def set_rope_factors(self, factors: np.ndarray) -> None:
        """GGUF `rope_freqs.weight`: the llama3 scaling baked into per-frequency divisors."""
        self._inv_freq = mx.array(rope_inv_freq(self.args, factors))

    def hidden(self, token_ids: mx.array, positions: mx.array, meta: StepAttention,
               kv: PagedKVCache | None) -> mx.array:
        """Last layer's output [T, hidden] before the final norm; writes the new K/V into `kv`."""
        x = self.model.embed_tokens(token_ids)
        cos, sin = rope_cos_sin(self._inv_freq, positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, meta, kv, i)
        return x

    def norm(self, h: mx.array) -> mx.array:
        return self.model.norm(h)

    def logits(self, h: mx.array) -> mx.array:
        """Final norm + lm_head (or the tied embedding) on the given rows only."""
        h = self.model.norm(h)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)
