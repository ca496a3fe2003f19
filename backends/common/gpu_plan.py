"""GPU memory planning, pure: how many layers go to the device, how big the KV pool may be, the default window.

llama.cpp counts n_layer + 1 offloadable layers: the repeating blocks and the output head (the input embedding
always stays on the CPU). `n_gpu_layers = k` puts the output head and the last k - 1 blocks on the device, and
each offloaded block's KV with it. Weights, KV and the compute buffer must fit the device's free memory: when
the whole model does not, as many layers as fit go (Ollama does the same: estimate the layers that fit, run the
rest on the CPU) and the load says so in a warning; it never asks for more than the device has.
"""
from __future__ import annotations

from dataclasses import dataclass

MiB, GiB = 1 << 20, 1 << 30
# Left free on the device for the CUDA/Metal context, allocator slack and the desktop (Ollama reserves a
# minimum per GPU too, plus OLLAMA_GPU_OVERHEAD)
DEVICE_RESERVE = 512 * MiB
COMPUTE_SLACK = 64 * MiB  # llama.cpp's graph buffers beyond the activations estimated below


def default_context_length(total_vram: int | None) -> int:
    """Ollama's default num_ctx by total VRAM (reference/ollama-api.md, `num_ctx`, v0.15.5+): under 24 GiB 4096,
    24-48 GiB 32768, 48 GiB and more 262144; no GPU: 4096 (daemon/settings.py's default before)."""
    if not total_vram or total_vram < 24 * GiB:
        return 4096
    if total_vram < 48 * GiB:
        return 32768
    return 262144


@dataclass(frozen=True)
class ModelFootprint:
    """Bytes of a model as llama.cpp places them."""

    layer_bytes: tuple[int, ...]  # weights of blk.0 .. blk.{n-1}
    output_bytes: int  # output head and final norm (the token embedding when the head is tied to it)
    kv_bytes_per_token_layer: float  # K + V of one token in one block at the planned KV types

    @property
    def n_layers(self) -> int:
        return len(self.layer_bytes)

    @property
    def all_layers(self) -> int:
        """n_gpu_layers that offloads everything (blocks and the output head)."""
        return self.n_layers + 1

    def weights_on_device(self, gpu_layers: int) -> int:
        """Weight bytes on the device with `gpu_layers` offloaded (the head first, then blocks from the last)."""
        k = max(0, min(gpu_layers, self.all_layers))
        if k == 0:
            return 0
        blocks = k - 1
        return self.output_bytes + sum(self.layer_bytes[self.n_layers - blocks:])

    def blocks_on_device(self, gpu_layers: int) -> int:
        return max(0, min(gpu_layers, self.all_layers) - 1)


def compute_buffer_bytes(*, n_ubatch: int, n_embd: int, n_vocab: int, n_ff: int, n_head: int, attn_ctx: int,
                         flash_attention: bool) -> int:
    """llama.cpp's compute buffer for one micro-batch, estimated as Ollama's GraphSize does: the larger of the
    logits (f32, one row per token) and one block's activations; without flash attention the f32 score matrix of
    every head over the attended cells too."""
    scores = 0 if flash_attention else n_head * attn_ctx
    per_token = max(n_embd + n_vocab, 4 * n_embd + 2 * n_ff + scores)
    return 4 * n_ubatch * per_token + COMPUTE_SLACK


@dataclass(frozen=True)
class OffloadPlan:
    gpu_layers: int  # llama.cpp n_gpu_layers
    kv_budget_bytes: int  # bytes the KV of ALL layers may take (what plan_kv sizes the pool from)
    dedicated_pool: bool  # the KV lives wholly in device memory (plan_kv may then give it many windows)
    weights_vram: int  # weight bytes on the device
    kv_vram_per_token: float  # KV bytes per token on the device
    warning: str | None = None

    def vram_bytes(self, kv_tokens: int) -> int:
        """Weights plus a KV pool of `kv_tokens` cells on the device (what /api/ps reports as size_vram)."""
        return int(self.weights_vram + self.kv_vram_per_token * kv_tokens)


def plan_offload(fp: ModelFootprint, *, free_bytes: int, requested_layers: int | None, min_kv_tokens: int,
                 compute_bytes: int, host_kv_bytes: int, kv_fraction: float = 0.9,
                 reserve_bytes: int = DEVICE_RESERVE) -> OffloadPlan:
    """Layers to offload and the KV budget. `requested_layers` is Ollama's num_gpu: None (or < 0) = as many as
    fit, 0 = CPU only, k = at most k (never more than fit: a larger request is cut, with a warning)."""
    per_layer_kv = max(fp.kv_bytes_per_token_layer, 1e-6)  # a recurrent model's KV does not grow per token
    usable = max(0, free_bytes - reserve_bytes - compute_bytes)

    def fits(k: int) -> bool:
        need = fp.weights_on_device(k) + per_layer_kv * fp.blocks_on_device(k) * min_kv_tokens
        return need <= usable

    asked = requested_layers is not None and requested_layers >= 0
    cap = min(requested_layers, fp.all_layers) if asked else fp.all_layers
    k = cap
    while k > 0 and not fits(k):
        k -= 1
    warning = None
    if k < cap:
        warning = (f"the model does not fit the GPU's free memory ({free_bytes / GiB:.1f} GiB free): "
                   f"{k} of {fp.all_layers} layers offloaded{f' (num_gpu asked {cap})' if asked else ''}, "
                   "the rest runs on the CPU")
    blocks_dev = fp.blocks_on_device(k)
    blocks_host = fp.n_layers - blocks_dev
    per_token_all = per_layer_kv * fp.n_layers
    # tokens the pool may hold: the device's room for its blocks' KV, host RAM's for the rest
    limits = []
    if blocks_dev:
        room = (usable - fp.weights_on_device(k)) * kv_fraction
        limits.append(room / (per_layer_kv * blocks_dev))
    if blocks_host:
        limits.append(host_kv_bytes / (per_layer_kv * blocks_host))
    tokens = min(limits) if limits else 0
    return OffloadPlan(gpu_layers=k, kv_budget_bytes=int(tokens * per_token_all), dedicated_pool=blocks_host == 0,
                       weights_vram=fp.weights_on_device(k), kv_vram_per_token=per_layer_kv * blocks_dev,
                       warning=warning)
