"""The MLX runner: one forward per engine step over the flattened mixed batch, paged KV in MLX arrays.

On Apple Silicon the default device is the GPU (Metal); on Linux the CPU build runs the same code.
MLX is lazy: each step builds one graph (every layer, every span) and `mx.eval` runs it once, so the
measured step time is the real cost of the whole mixed batch. Weights and the KV cache are evaluated at
load, so the engine thread (not the loading thread) can run steps on its own per-thread default stream.
"""
from __future__ import annotations

import logging
import time

import mlx.core as mx
import numpy as np

from ..base import Batch, ModelInfo, Runner, RunnerSettings
from ..common import build_model_info
from ..common.paged_setup import check_settings, log_loaded, pick_dtype, plan_pool
from ..common.paging import PagedPrefixIO, check_ids, check_step
from .attention import build_step_attention, dense_causal
from .paged_kv import PagedKVCache, kv_budget_bytes
from .models import build_model
from .weights import load_weights

log = logging.getLogger(__name__)

_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
_DEVICES = ("auto", "cpu", "gpu", "metal", "mps")


def resolve_device(name: str) -> mx.Device:
    """`auto` = MLX's default (Metal GPU on a Mac, CPU on the Linux CPU build); `gpu`/`metal`/`mps` ask for Metal."""
    if name not in _DEVICES:
        raise ValueError(f"device {name!r} invalid for the mlx backend; allowed: {', '.join(_DEVICES)}")
    if name == "auto":
        return mx.default_device()
    if name == "cpu":
        return mx.Device(mx.cpu)
    if not mx.metal.is_available():
        raise ValueError(f"device {name!r} requested but this MLX build has no Metal GPU (use cpu or auto)")
    return mx.Device(mx.gpu)


def resolve_dtype(name: str, device: mx.Device) -> mx.Dtype:
    """`auto` = bfloat16 on the GPU (mlx-lm's usual), float32 on the CPU (exact, and CPU bf16 matmuls are slow)."""
    return pick_dtype(name, mx.bfloat16 if device.type == mx.gpu else mx.float32, _DTYPES)


class MlxRunner(PagedPrefixIO, Runner):
    """A loaded model on MLX. Its KV lives in the engine's blocks, so Runner's prefix-cache
    defaults fit as they are."""

    backend = "mlx"

    def __init__(self, model_path: str, settings: RunnerSettings) -> None:
        t0 = time.perf_counter()
        check_settings(settings)
        self._mx_device = resolve_device(settings.device)
        self.device = "gpu" if self._mx_device.type == mx.gpu else "cpu"  # what the engine's CPU checks read
        self.dtype = resolve_dtype(settings.dtype, self._mx_device)
        if settings.num_threads is not None:
            log.info("mlx backend: num_threads=%s ignored (MLX sizes its CPU thread pool itself)", settings.num_threads)
        with mx.stream(self._mx_device):
            loaded = load_weights(model_path)
            files = loaded.files
            self.args = files.args
            self.model = build_model(self.args, loaded.weights, self.dtype, model_path, loaded.quant_mode)
        extra = dict(files.metadata)
        if loaded.quantization:
            extra.update({f"mlx.quantization.{k}": v for k, v in loaded.quantization.items()})
        self.info: ModelInfo = build_model_info(self.args, loaded.parameter_count, files.file_type, extra)
        self.tokenizer = files.tokenizer
        self.chat_template = files.chat_template
        pool = plan_pool(self.args, settings, self.dtype.size, kv_budget_bytes(self._mx_device,
                                                                              settings.kv_memory_fraction), False)
        self.block_size, self.context_length = pool.block_size, pool.context_length
        self.num_kv_blocks, self.max_num_seqs = pool.num_kv_blocks, pool.max_num_seqs
        with mx.stream(self._mx_device):
            self.kv: PagedKVCache | None = PagedKVCache(pool.num_layers, pool.num_kv_blocks, pool.block_size,
                                                        pool.n_kv_heads, pool.head_dim, self.dtype)
        log_loaded(log, self.backend, model_path, self, pool, time.perf_counter() - t0)

    def _ids(self, token_ids: list[int]) -> mx.array:
        check_ids(token_ids, self.args.vocab_size)
        return mx.array(np.asarray(token_ids, dtype=np.int32))

    def step(self, batch: Batch) -> np.ndarray:
        """One forward pass over every token of the step; float32 logits for `batch.logits_rows`."""
        if self.kv is None:
            raise RuntimeError("runner is closed")
        check_step(batch, self.block_size, self.num_kv_blocks, self.args.vocab_size)
        rows = batch.logits_rows
        if batch.num_tokens == 0:
            return np.zeros((0, self.args.vocab_size), dtype=np.float32)
        ids = mx.array(np.asarray(batch.token_ids, dtype=np.int32))
        with mx.stream(self._mx_device):
            meta = build_step_attention(batch)
            positions = mx.array(np.asarray(batch.positions, dtype=np.int32))
            h = self.model.hidden(ids, positions, meta, self.kv)
            outputs = self.kv.arrays()  # the KV writes must run even when no row needs logits
            logits = None
            if rows:
                logits = self.model.logits(h[mx.array(np.asarray(rows, dtype=np.int32))]).astype(mx.float32)
                outputs = [logits] + outputs
            mx.eval(outputs)  # the one evaluation of this step's graph
        if logits is None:
            return np.zeros((0, self.args.vocab_size), dtype=np.float32)
        return np.array(logits, copy=True)

    def embed(self, token_ids: list[int]) -> np.ndarray:
        """Final normed hidden states [n, hidden] of one causal pass; the KV cache is not touched."""
        if not token_ids:
            return np.zeros((0, self.args.hidden_size), dtype=np.float32)
        ids = self._ids(token_ids)
        with mx.stream(self._mx_device):
            positions = mx.arange(len(token_ids), dtype=mx.int32)
            h = self.model.norm(self.model.hidden(ids, positions, dense_causal(len(token_ids)), None))
            out = h.astype(mx.float32)
            mx.eval(out)
        return np.array(out, copy=True)

    def free(self, slot: int) -> None:
        """Nothing to do: KV lives in blocks the engine frees; stale block contents are overwritten on reuse."""

    def close(self) -> None:
        if self.kv is not None:
            self.kv.close()
        self.kv = None
        self.model = None  # type: ignore[assignment]
        mx.clear_cache()


def load(model_path: str, settings: RunnerSettings) -> MlxRunner:
    """Load a GGUF file or an HF / MLX-community directory onto MLX."""
    return MlxRunner(model_path, settings)
