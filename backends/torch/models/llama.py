"""Llama / Mistral decoder (Qwen2/Qwen3 too: ModelArgs' flags): flattened tokens, paged KV attention.

Parameter names equal HF's (`model.layers.N.self_attn.q_proj.weight`, ...) so HF and GGUF weights load
by name. Every tensor is [T, ...] over the flattened mixed batch: one matmul per linear per step.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ...common import rope
from ...common.model_args import ModelArgs
from ..attention import StepAttention, paged_attention
from ..paged_kv import PagedKVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like HF does, so bf16 runs stay close to the reference.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(args: ModelArgs, freq_factors: np.ndarray | None = None) -> torch.Tensor:
    """common.rope's inverse frequencies (float32, CPU), the unscaled ones from torch's float32 pow: exactly what
    transformers computes (numpy's pow can differ in the last bit)."""
    dim = int(args.head_dim or 0)
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    return torch.from_numpy(rope.rope_inv_freq(args, freq_factors, inv.numpy()))


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, 1, head_dim] for the NeoX-style rotate-half layout HF uses."""
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


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
        self.q_norm = RMSNorm(hd, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(hd, args.rms_norm_eps) if args.qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepAttention,
                cache: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.n_kv, self.head_dim)
        v = self.v_proj(x).view(t, self.n_kv, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = paged_attention(q, k, v, cache, meta, self.scale)
        return self.o_proj(out.reshape(t, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.mlp_bias)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepAttention,
                cache: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, meta, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """`model.*` in HF naming: embeddings, layers, final norm."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(args) for _ in range(args.num_hidden_layers)])
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Model(nn.Module):
    """A causal LM: `hidden()` runs every layer over the flattened batch, `logits()` only the needed rows."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.model = DecoderStack(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(args), persistent=False)

    def hidden(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: StepAttention,
               kv: PagedKVCache | None) -> torch.Tensor:
        """Last layer's output [T, hidden] before the final norm; writes the new K/V into `kv`."""
        x = self.model.embed_tokens(token_ids)
        cos, sin = rope_cos_sin(self.inv_freq, positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, meta, kv.flat(i) if kv is not None else None)
        return x

    def norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.model.norm(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm + lm_head on the given rows only."""
        return self.lm_head(self.model.norm(h))
