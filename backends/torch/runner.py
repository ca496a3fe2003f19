"""The PyTorch runner: one forward per engine step over the flattened mixed batch, paged KV in torch tensors."""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ..base import Batch, InsufficientMemory, ModelInfo, Runner, RunnerSettings
from ..common import build_model_info, open_model
from ..common.paged_setup import check_settings, log_loaded, pick_dtype, plan_pool
from ..common.paging import PagedPrefixIO, check_ids, check_step
from .attention import build_step_attention, dense_causal
from .paged_kv import PagedKVCache, kv_budget_bytes
from .models import build_model

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """`auto` = CUDA if available, else CPU; otherwise cpu | cuda | cuda:N | mps."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} invalid; allowed: auto, cpu, cuda, cuda:N, mps") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available (torch {torch.__version__})")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} requested but MPS is not available")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {name!r} invalid; allowed: auto, cpu, cuda, cuda:N, mps")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto` = bfloat16 on CUDA (float16 on MPS), float32 on CPU."""
    return pick_dtype(name, {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32), _DTYPES)


class TorchRunner(PagedPrefixIO, Runner):
    """A loaded model on torch. Its KV lives in the engine's blocks, so Runner's prefix-cache
    defaults fit as they are."""

    backend = "torch"

    def __init__(self, model_path: str, settings: RunnerSettings) -> None:
        t0 = time.perf_counter()
        check_settings(settings)
        self.device = resolve_device(settings.device)
        self.dtype = resolve_dtype(settings.dtype, self.device)
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        src = open_model(model_path)
        files = src.files()
        self.args = files.args
        try:
            self.model = build_model(self.args, src.iter_tensors(), self.device, self.dtype, model_path)
        except torch.cuda.OutOfMemoryError as e:
            raise InsufficientMemory(f"{model_path}: not enough GPU memory for the weights ({e})") from None
        self.info: ModelInfo = build_model_info(self.args, src.parameter_count, files.file_type, files.metadata)
        self.tokenizer = files.tokenizer
        self.chat_template = files.chat_template
        pool = plan_pool(self.args, settings, torch.empty((), dtype=self.dtype).element_size(),
                         kv_budget_bytes(self.device, settings.kv_memory_fraction), self.device.type == "cuda")
        self.block_size, self.context_length = pool.block_size, pool.context_length
        self.num_kv_blocks, self.max_num_seqs = pool.num_kv_blocks, pool.max_num_seqs
        self.kv: PagedKVCache | None = PagedKVCache(pool.num_layers, pool.num_kv_blocks, pool.block_size,
                                                    pool.n_kv_heads, pool.head_dim, self.device, self.dtype)
        log_loaded(log, self.backend, model_path, self, pool, time.perf_counter() - t0)

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def step(self, batch: Batch) -> np.ndarray:
        """One forward pass over every token of the step; float32 logits for `batch.logits_rows`."""
        if self.kv is None:
            raise RuntimeError("runner is closed")
        check_step(batch, self.block_size, self.num_kv_blocks, self.args.vocab_size)
        rows = batch.logits_rows
        if batch.num_tokens == 0:
            return np.zeros((0, self.args.vocab_size), dtype=np.float32)
        meta = build_step_attention(batch, self.device)
        h = self.model.hidden(self._tensor(batch.token_ids), self._tensor(batch.positions), meta, self.kv)
        if not rows:
            return np.zeros((0, self.args.vocab_size), dtype=np.float32)
        logits = self.model.logits(h[self._tensor(rows)])
        return logits.float().cpu().numpy()

    @torch.inference_mode()
    def embed(self, token_ids: list[int]) -> np.ndarray:
        """Final normed hidden states [n, hidden] of one causal pass; the KV cache is not touched."""
        if not token_ids:
            return np.zeros((0, self.args.hidden_size), dtype=np.float32)
        check_ids(token_ids, self.args.vocab_size)
        ids = self._tensor(token_ids)
        h = self.model.hidden(ids, torch.arange(len(token_ids), device=self.device), dense_causal(len(token_ids)), None)
        return self.model.norm(h).float().cpu().numpy()

    def free(self, slot: int) -> None:
        """Nothing to do: KV lives in blocks the engine frees; stale block contents are overwritten on reuse."""

    def close(self) -> None:
        if self.kv is not None:
            self.kv.close()
        self.kv = None
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def load(model_path: str, settings: RunnerSettings) -> TorchRunner:
    """Load a GGUF file or an HF directory onto torch."""
    return TorchRunner(model_path, settings)
