"""Where a GGUF's layers go: the GPU plan (common/gpu_plan.py) fed with the file's tensor sizes and the devices
llama.cpp sees, turned into llama_model_params fields (n_gpu_layers, main_gpu, split_mode, devices)."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace

from ..base import RunnerSettings
from ..common.gpu_plan import ModelFootprint, compute_buffer_bytes, plan_offload
from .devices import Device, device_array, offload_devices, supports_gpu_offload  # noqa: F401 (device_array: runner)
from .gguf_info import GGUFHeader
from .rpc import add_servers_from_env

log = logging.getLogger(__name__)

_BLOCK = re.compile(r"blk\.(\d+)\.")
SPLIT_MODE_NONE, SPLIT_MODE_LAYER = 0, 1  # enum llama_split_mode


def footprint(header: GGUFHeader, kv_bytes_per_token: float) -> ModelFootprint:
    """Weight bytes per block and of the output head from the tensor table; KV per token per block."""
    arch = header.metadata.get("general.architecture", "")
    n_layers = int(header.metadata.get(f"{arch}.block_count") or 0)
    layers = [0] * n_layers
    names = {t.name: t for t in header.tensors}
    output = 0
    for t in header.tensors:
        m = _BLOCK.match(t.name)
        if m and int(m.group(1)) < n_layers:
            layers[int(m.group(1))] += t.n_bytes
        elif t.name.startswith(("output.", "output_norm.")):
            output += t.n_bytes
    if "output.weight" not in names and "token_embd.weight" in names:  # a tied head: llama.cpp duplicates it there
        output += names["token_embd.weight"].n_bytes
    return ModelFootprint(tuple(layers), output, kv_bytes_per_token / max(n_layers, 1))


@dataclass
class Placement:
    """What the runner loads with: layers on the device(s), the KV budget, the devices named."""

    gpu_layers: int
    budget_bytes: int | None  # KV of all layers; None: host RAM rules (CPU only)
    dedicated_pool: bool
    footprint: ModelFootprint | None = None
    devices: list[Device] = field(default_factory=list)  # the devices offloaded to (empty: CPU)
    main_gpu: int | None = None  # index into the offload devices: the whole model on that one (split mode none)
    host_kv_bytes: int = 0
    warning: str | None = None  # why fewer layers than asked went to the GPU

    def vram_bytes(self, kv_tokens: int) -> int:
        """Weights and KV on the device(s) with a pool of `kv_tokens` cells (/api/ps size_vram)."""
        fp = self.footprint
        if fp is None or not self.gpu_layers:
            return 0
        return int(fp.weights_on_device(self.gpu_layers)
                   + fp.kv_bytes_per_token_layer * fp.blocks_on_device(self.gpu_layers) * kv_tokens)


def requested_layers(settings: RunnerSettings) -> int | None:
    """Ollama's num_gpu (None or < 0: as many as fit); device "cpu" means 0."""
    if settings.device == "cpu":
        return 0
    return settings.num_gpu


def place(header: GGUFHeader, settings: RunnerSettings, kv_bytes_per_token: float, host_kv_bytes: int,
          devices: list[Device] | None = None) -> Placement:
    """The placement for this model on this machine; `devices` defaults to llama.cpp's offload devices."""
    want = requested_layers(settings)
    add_servers_from_env()  # RPC servers are devices too, once registered
    if want == 0 or not supports_gpu_offload():
        if want not in (None, 0) and want > 0:
            log.warning("num_gpu=%d asked for, but this llama.cpp build cannot offload (CPU only): running on the CPU",
                        want)
        return Placement(0, None, False)
    devices = offload_devices() if devices is None else devices
    if not devices:
        log.warning("llama.cpp was built with GPU offload but sees no GPU: running on the CPU")
        return Placement(0, None, False)
    main = settings.main_gpu
    if main is not None and not 0 <= main < len(devices):
        raise ValueError(f"main_gpu={main} but llama.cpp sees {len(devices)} GPU(s): "
                         f"{', '.join(f'{i}={d.name}' for i, d in enumerate(devices))}")
    used = [devices[main]] if main is not None else devices
    md = header.metadata
    arch = md.get("general.architecture", "")
    n_vocab = header.skipped_arrays.get("tokenizer.ggml.tokens") or len(md.get("tokenizer.ggml.tokens") or []) or 32000

    def key(name: str) -> int:
        v = md.get(f"{arch}.{name}", 0)
        return int(v[0] if isinstance(v, list) and v else v or 0)

    flash = settings.flash_attention != "off"  # auto = on where the GPU kernels have it (CUDA, Metal)
    ctx = settings.context_length or key("context_length") or 4096
    n_ubatch = min(max(settings.max_num_batched_tokens, 1), 512)
    compute = compute_buffer_bytes(n_ubatch=n_ubatch, n_embd=key("embedding_length"), n_vocab=int(n_vocab),
                                   n_ff=key("feed_forward_length"), n_head=key("attention.head_count"),
                                   attn_ctx=ctx, flash_attention=flash)
    fp = footprint(header, kv_bytes_per_token)
    plan = plan_offload(fp, free_bytes=sum(d.free for d in used), requested_layers=want, min_kv_tokens=ctx,
                        compute_bytes=compute * len(used), host_kv_bytes=host_kv_bytes,
                        kv_fraction=settings.kv_memory_fraction)
    if plan.warning:
        log.warning("%s: %s", header.path, plan.warning)
    if plan.gpu_layers == 0:
        return Placement(0, None, False, warning=plan.warning)
    return Placement(plan.gpu_layers, plan.kv_budget_bytes, plan.dedicated_pool, fp, used, main, host_kv_bytes,
                     plan.warning)


_OOM = re.compile(r"alloc|out of memory|cudaMalloc|not enough memory", re.IGNORECASE)


def out_of_memory(message: str) -> bool:
    """Whether a load or context failure reads as llama.cpp failing to allocate a buffer."""
    return bool(_OOM.search(message))


def smaller(p: Placement, path: str) -> Placement | None:
    """The next placement to try after llama.cpp could not allocate this one: half the KV pool (down to 256 MiB),
    then half the layers (their KV on the host, within its budget); None when only the CPU is left."""
    if p.gpu_layers == 0 or p.footprint is None:
        return None
    if p.budget_bytes and p.budget_bytes > (1 << 28):
        log.warning("%s: llama.cpp could not allocate the plan; retrying with half the KV pool", path)
        return replace(p, budget_bytes=p.budget_bytes // 2)
    layers = p.gpu_layers // 2
    log.warning("%s: llama.cpp could not allocate the plan; retrying with %d GPU layers", path, layers)
    if layers == 0:
        return Placement(0, None, False, warning=f"only the CPU could hold the model ({p.gpu_layers} layers failed)")
    fp = p.footprint
    host_blocks = fp.n_layers - fp.blocks_on_device(layers)
    host_cap = p.host_kv_bytes / (max(fp.kv_bytes_per_token_layer, 1e-6) * host_blocks) * fp.kv_bytes_per_token_layer \
        * fp.n_layers
    return replace(p, gpu_layers=layers, budget_bytes=int(min(p.budget_bytes or host_cap, host_cap)),
                   dedicated_pool=False, warning=f"{layers} of {fp.all_layers} layers on the GPU after an allocation "
                                                  "failure")
