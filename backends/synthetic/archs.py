"""GGUF-only architectures: Gemma 3 (sliding window), gpt-oss (sliding window, sinks, MoE), Qwen3-MoE, LFM2 and
Qwen3.5 (hybrid recurrent), DeepSeek-V2/V3 (MLA, MoE).

Only llama.cpp runs these (the torch and MLX backends implement the Llama decoder alone), so the factory writes
them as GGUF only, with llama.cpp's tensor names and shapes (`llama-arch.cpp`, `models/<arch>.cpp` of the pinned
llama-cpp-python) and the metadata keys its loader reads. Each architecture's extra shape (window, experts, ranks,
recurrent widths) lives in `ModelSpec.arch_options`, filled with the defaults below. Shapes here are numpy order
(rows = output features), the reverse of ggml's `ne`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Shapes = dict[str, tuple[int, ...]]
# Bump when the bytes written for an unchanged spec of these architectures change (shapes, weights, metadata).
ARCHS_VERSION = 1


@dataclass(frozen=True)
class ArchDef:
    """One GGUF-only architecture: its default options, tensor shapes and metadata."""

    name: str  # llama.cpp's architecture name (general.architecture)
    defaults: dict[str, Any]
    shapes: Callable[[Any, dict], Shapes]  # (spec, options) -> GGUF tensor name -> numpy shape
    metadata: Callable[[Any, Any, dict], None]  # (writer, spec, options): the architecture's own keys
    kind: str  # what a reader of the README needs: "sliding window", "MoE", "hybrid recurrent", "MLA"
    tied_output: bool = True  # llama.cpp falls back to token_embd when output.weight is absent


def _attn(p: str, h: int, q: int, kv: int, hd: int, qk_norm: bool = True) -> Shapes:
    out = {p + "attn_norm.weight": (h,), p + "attn_q.weight": (q, h), p + "attn_k.weight": (kv, h),
           p + "attn_v.weight": (kv, h), p + "attn_output.weight": (h, q)}
    if qk_norm:
        out[p + "attn_q_norm.weight"] = (hd,)
        out[p + "attn_k_norm.weight"] = (hd,)
    return out


def _ffn(p: str, h: int, i: int) -> Shapes:
    return {p + "ffn_gate.weight": (i, h), p + "ffn_up.weight": (i, h), p + "ffn_down.weight": (h, i)}


def _experts(p: str, h: int, n: int, i: int) -> Shapes:
    return {p + "ffn_gate_inp.weight": (n, h), p + "ffn_gate_exps.weight": (n, i, h),
            p + "ffn_up_exps.weight": (n, i, h), p + "ffn_down_exps.weight": (n, h, i)}


def _top(spec, body: Shapes, tied_ok: bool = True, norm: str = "output_norm.weight") -> Shapes:
    h, v = spec.hidden_size, spec.vocab_size
    out: Shapes = {"token_embd.weight": (v, h), **body, norm: (h,)}
    if not (tied_ok and spec.tie_word_embeddings):
        out["output.weight"] = (v, h)
    return out


def _dims(spec) -> tuple[int, int, int, int]:
    hd = spec.resolved_head_dim
    return spec.hidden_size, spec.num_attention_heads * hd, spec.num_key_value_heads * hd, hd


def _common(w, spec, heads_kv: Any = None, key_length: int | None = None, value_length: int | None = None) -> None:
    hd = spec.resolved_head_dim
    w.add_context_length(spec.max_position_embeddings)
    w.add_embedding_length(spec.hidden_size)
    w.add_block_count(spec.num_hidden_layers)
    w.add_feed_forward_length(spec.intermediate_size)
    w.add_head_count(spec.num_attention_heads)
    w.add_head_count_kv(spec.num_key_value_heads if heads_kv is None else heads_kv)
    w.add_key_length(key_length or hd)
    w.add_value_length(value_length or hd)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_norm_eps)


# ---- Gemma 3: 5 of every 6 layers attend a sliding window; RMS norms around attention and FFN ----
def _gemma3_shapes(spec, o: dict) -> Shapes:
    h, q, kv, hd = _dims(spec)
    body: Shapes = {}
    for n in range(spec.num_hidden_layers):
        p = f"blk.{n}."
        body |= _attn(p, h, q, kv, hd) | {p + "post_attention_norm.weight": (h,), p + "ffn_norm.weight": (h,)}
        body |= _ffn(p, h, spec.intermediate_size) | {p + "post_ffw_norm.weight": (h,)}
    return _top(spec, body)


def _gemma3_meta(w, spec, o: dict) -> None:
    _common(w, spec)
    w.add_sliding_window(o["sliding_window"])
    w.add_sliding_window_pattern(o["sliding_window_pattern"])
    w.add_rope_freq_base_swa(o["rope_freq_base_swa"])


# ---- gpt-oss: alternating window/full attention with learned sinks, biased projections, MoE with biases ----
def _gpt_oss_shapes(spec, o: dict) -> Shapes:
    h, q, kv, hd = _dims(spec)
    n, i = o["num_experts"], o["expert_intermediate_size"]
    body: Shapes = {}
    for layer in range(spec.num_hidden_layers):
        p = f"blk.{layer}."
        body |= _attn(p, h, q, kv, hd, qk_norm=False)
        body |= {p + "attn_q.bias": (q,), p + "attn_k.bias": (kv,), p + "attn_v.bias": (kv,),
                 p + "attn_output.bias": (h,), p + "attn_sinks.weight": (spec.num_attention_heads,),
                 p + "post_attention_norm.weight": (h,)}
        body |= _experts(p, h, n, i) | {p + "ffn_gate_inp.bias": (n,), p + "ffn_gate_exps.bias": (n, i),
                                        p + "ffn_up_exps.bias": (n, i), p + "ffn_down_exps.bias": (n, h)}
    return _top(spec, body, tied_ok=False)


def _gpt_oss_meta(w, spec, o: dict) -> None:
    _common(w, spec)
    w.add_rope_dimension_count(spec.resolved_head_dim)
    w.add_sliding_window(o["sliding_window"])
    w.add_expert_count(o["num_experts"])
    w.add_expert_used_count(o["experts_per_token"])
    w.add_expert_feed_forward_length(o["expert_intermediate_size"])


# ---- Qwen3-MoE: Qwen3 attention (q/k norms), every layer's FFN a mixture of experts ----
def _qwen3moe_shapes(spec, o: dict) -> Shapes:
    h, q, kv, hd = _dims(spec)
    body: Shapes = {}
    for n in range(spec.num_hidden_layers):
        p = f"blk.{n}."
        body |= _attn(p, h, q, kv, hd) | {p + "ffn_norm.weight": (h,)}
        body |= _experts(p, h, o["num_experts"], o["expert_intermediate_size"])
    return _top(spec, body)


def _qwen3moe_meta(w, spec, o: dict) -> None:
    _common(w, spec)
    w.add_expert_count(o["num_experts"])
    w.add_expert_used_count(o["experts_per_token"])
    w.add_expert_feed_forward_length(o["expert_intermediate_size"])


# ---- LFM2: short-convolution layers (a recurrent state of conv_l_cache - 1 steps) between attention layers ----
def _lfm2_attention(spec, o: dict) -> list[bool]:
    return [n % o["attention_every"] == o["attention_every"] - 1 for n in range(spec.num_hidden_layers)]


def _lfm2_shapes(spec, o: dict) -> Shapes:
    h, q, kv, hd = _dims(spec)
    body: Shapes = {}
    for n, attention in enumerate(_lfm2_attention(spec, o)):
        p = f"blk.{n}."
        if attention:
            body |= _attn(p, h, h, kv, hd)
        else:
            body |= {p + "attn_norm.weight": (h,), p + "shortconv.conv.weight": (h, o["conv_l_cache"]),
                     p + "shortconv.in_proj.weight": (3 * h, h), p + "shortconv.out_proj.weight": (h, h)}
        body |= {p + "ffn_norm.weight": (h,)} | _ffn(p, h, spec.intermediate_size)
    return _top(spec, body, norm="token_embd_norm.weight")  # llama.cpp's name for LFM2's final norm


def _lfm2_meta(w, spec, o: dict) -> None:
    _common(w, spec, heads_kv=[spec.num_key_value_heads if a else 0 for a in _lfm2_attention(spec, o)])
    w.add_shortconv_l_cache(o["conv_l_cache"])


# ---- Qwen3.5: gated delta-net (linear attention, a recurrent state) with a gated full attention layer every N ----
def _qwen35_shapes(spec, o: dict) -> Shapes:
    h, q, kv, hd = _dims(spec)
    ds, groups, vheads = o["ssm_state_size"], o["ssm_group_count"], o["ssm_time_step_rank"]
    key_dim, value_dim = ds * groups, ds * vheads
    body: Shapes = {}
    for n in range(spec.num_hidden_layers):
        p = f"blk.{n}."
        body |= {p + "attn_norm.weight": (h,), p + "post_attention_norm.weight": (h,)}
        if (n + 1) % o["full_attention_interval"] == 0:
            body |= _attn(p, h, 2 * q, kv, hd)  # the query projection carries the output gate too
            body[p + "attn_output.weight"] = (h, q)
        else:
            body |= {p + "attn_qkv.weight": (2 * key_dim + value_dim, h), p + "attn_gate.weight": (value_dim, h),
                     p + "ssm_conv1d.weight": (2 * key_dim + value_dim, o["ssm_conv_kernel"]),
                     p + "ssm_dt.bias": (vheads,), p + "ssm_a": (vheads,), p + "ssm_beta.weight": (vheads, h),
                     p + "ssm_alpha.weight": (vheads, h), p + "ssm_norm.weight": (ds,),
                     p + "ssm_out.weight": (h, value_dim)}
        body |= _ffn(p, h, spec.intermediate_size)
    return _top(spec, body)


def _qwen35_meta(w, spec, o: dict) -> None:
    _common(w, spec)
    w.add_rope_dimension_count(o["rope_dimension_count"])
    w.add_rope_dimension_sections(o["rope_sections"])
    w.add_ssm_conv_kernel(o["ssm_conv_kernel"])
    w.add_ssm_state_size(o["ssm_state_size"])
    w.add_ssm_group_count(o["ssm_group_count"])
    w.add_ssm_time_step_rank(o["ssm_time_step_rank"])
    w.add_ssm_inner_size(o["ssm_state_size"] * o["ssm_time_step_rank"])
    w.add_full_attention_interval(o["full_attention_interval"])


# ---- DeepSeek-V2/V3: multi-head latent attention (a compressed KV row per token), shared + routed experts ----
def _deepseek2_shapes(spec, o: dict) -> Shapes:
    h, heads = spec.hidden_size, spec.num_attention_heads
    rope, nope, vd, rank, qrank = (o["qk_rope_head_dim"], o["qk_nope_head_dim"], o["v_head_dim"], o["kv_lora_rank"],
                                   o["q_lora_rank"])
    n, i = o["num_experts"], o["expert_intermediate_size"]
    body: Shapes = {}
    for layer in range(spec.num_hidden_layers):
        p = f"blk.{layer}."
        body |= {p + "attn_norm.weight": (h,), p + "attn_q_a_norm.weight": (qrank,),
                 p + "attn_kv_a_norm.weight": (rank,), p + "attn_q_a.weight": (qrank, h),
                 p + "attn_q_b.weight": (heads * (nope + rope), qrank), p + "attn_kv_a_mqa.weight": (rank + rope, h),
                 p + "attn_k_b.weight": (heads, rank, nope), p + "attn_v_b.weight": (heads, vd, rank),
                 p + "attn_output.weight": (h, heads * vd), p + "ffn_norm.weight": (h,)}
        if layer < o["leading_dense_blocks"]:
            body |= _ffn(p, h, spec.intermediate_size)
        else:
            shared = i * o["shared_experts"]
            body |= _experts(p, h, n, i) | {p + "ffn_gate_shexp.weight": (shared, h),
                                            p + "ffn_up_shexp.weight": (shared, h),
                                            p + "ffn_down_shexp.weight": (h, shared)}
    return _top(spec, body)


def _deepseek2_meta(w, spec, o: dict) -> None:
    rank, rope = o["kv_lora_rank"], o["qk_rope_head_dim"]
    # MLA is stored as one KV head whose key is the latent row plus the rope part (as convert_hf_to_gguf does)
    _common(w, spec, heads_kv=1, key_length=rank + rope, value_length=rank)
    w.add_leading_dense_block_count(o["leading_dense_blocks"])
    w.add_q_lora_rank(o["q_lora_rank"])
    w.add_kv_lora_rank(rank)
    w.add_key_length_mla(o["qk_nope_head_dim"] + rope)
    w.add_value_length_mla(o["v_head_dim"])
    w.add_expert_feed_forward_length(o["expert_intermediate_size"])
    w.add_expert_count(o["num_experts"])
    w.add_expert_used_count(o["experts_per_token"])
    w.add_expert_shared_count(o["shared_experts"])
    w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope)


_MOE = {"num_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 32}
ARCHS: dict[str, ArchDef] = {a.name: a for a in (
    ArchDef("gemma3", {"sliding_window": 16, "sliding_window_pattern": 2, "rope_freq_base_swa": 10000.0},
            _gemma3_shapes, _gemma3_meta, "sliding window"),
    ArchDef("gpt-oss", {"sliding_window": 16, **_MOE}, _gpt_oss_shapes, _gpt_oss_meta,
            "sliding window, attention sinks, MoE", tied_output=False),
    ArchDef("qwen3moe", dict(_MOE), _qwen3moe_shapes, _qwen3moe_meta, "MoE"),
    ArchDef("lfm2", {"conv_l_cache": 3, "attention_every": 2}, _lfm2_shapes, _lfm2_meta, "hybrid recurrent"),
    ArchDef("qwen35", {"full_attention_interval": 2, "ssm_conv_kernel": 4, "ssm_state_size": 16,
                       "ssm_group_count": 2, "ssm_time_step_rank": 4, "rope_dimension_count": 8,
                       "rope_sections": [2, 1, 1, 0]}, _qwen35_shapes, _qwen35_meta, "hybrid recurrent"),
    ArchDef("deepseek2", {"q_lora_rank": 32, "kv_lora_rank": 32, "qk_rope_head_dim": 32, "qk_nope_head_dim": 16,
                          "v_head_dim": 16, "leading_dense_blocks": 1, "shared_experts": 1, **_MOE},
            _deepseek2_shapes, _deepseek2_meta, "MLA, MoE"),
)}
GGUF_ONLY = tuple(ARCHS)


def resolve_options(architecture: str, given: dict[str, Any] | None) -> dict[str, Any] | None:
    """An architecture's options: its defaults with `given` over them (None for the HF-and-GGUF architectures)."""
    arch = ARCHS.get(architecture)
    if arch is None:
        if given:
            raise ValueError(f"arch_options={given!r}: architecture {architecture!r} takes none")
        return None
    unknown = sorted(set(given or {}) - set(arch.defaults))
    if unknown:
        raise ValueError(f"arch_options {unknown} unknown for {architecture}; allowed: {', '.join(arch.defaults)}")
    return {**arch.defaults, **(given or {})}


def arch_shapes(spec) -> Shapes:
    return ARCHS[spec.architecture].shapes(spec, spec.arch_options)


def parameter_count(spec) -> int:
    total = 0
    for shape in arch_shapes(spec).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total
