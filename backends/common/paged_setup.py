"""What the torch and MLX runners do alike when they load: check the settings, pick a dtype, size the paged KV pool.

Both keep the KV in the engine's blocks (one pool of `num_kv_blocks` blocks of `block_size` positions, every layer's
K and V); only the array library differs, so each runner passes its own element size and memory budget.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

from ..base import RunnerSettings
from .kv_plan import plan_kv
from .model_args import ModelArgs

D = TypeVar("D")


def check_settings(settings: RunnerSettings) -> None:
    """ValueError for settings no paged runner can take."""
    if settings.block_size <= 0:
        raise ValueError(f"block_size={settings.block_size} must be > 0")
    if settings.num_threads is not None and settings.num_threads <= 0:
        raise ValueError(f"num_threads={settings.num_threads} must be a positive int")


def pick_dtype(name: str, auto: D, dtypes: Mapping[str, D]) -> D:
    """The dtype `name` asks for: `auto` for "auto", else one of `dtypes` (ValueError naming them)."""
    if name == "auto":
        return auto
    if name not in dtypes:
        raise ValueError(f"dtype {name!r} invalid; allowed: auto, {', '.join(dtypes)}")
    return dtypes[name]


@dataclass(frozen=True)
class PagedPool:
    """The KV pool a runner allocates: its blocks and slots, and the shape of one block."""

    num_layers: int
    block_size: int
    n_kv_heads: int
    head_dim: int
    num_kv_blocks: int
    max_num_seqs: int
    context_length: int  # the window one sequence is planned for (num_ctx, else the trained one)
    block_bytes: int

    @property
    def mib(self) -> float:
        return self.num_kv_blocks * self.block_bytes / 2**20


def plan_pool(args: ModelArgs, settings: RunnerSettings, elem_bytes: int, budget_bytes: int,
              dedicated_pool: bool) -> PagedPool:
    """Size the pool for `args` at `elem_bytes` per value within `budget_bytes` (common.kv_plan.plan_kv's rules;
    `dedicated_pool`: GPU memory of its own, where the KV may take what the weights left)."""
    layers, n_kv, hd = args.num_hidden_layers, int(args.num_key_value_heads or 0), int(args.head_dim or 0)
    context = settings.context_length or args.max_position_embeddings
    block_bytes = 2 * layers * settings.block_size * n_kv * hd * elem_bytes  # K and V of every layer
    blocks, seqs = plan_kv(requested_blocks=settings.num_kv_blocks, max_num_seqs=settings.max_num_seqs,
                           context_length=context, block_size=settings.block_size, block_bytes=block_bytes,
                           budget_bytes=budget_bytes, dedicated_pool=dedicated_pool)
    return PagedPool(layers, settings.block_size, n_kv, hd, blocks, seqs, context, block_bytes)


def log_loaded(log: logging.Logger, backend: str, model_path: str, runner: Any, pool: PagedPool,
               seconds: float) -> None:
    log.info("%s runner: %s (%s, %s) on %s/%s, %d KV blocks x %d tokens (%.1f MiB), loaded in %.2fs", backend,
             model_path, runner.info.architecture, runner.info.file_type, runner.device, runner.dtype,
             pool.num_kv_blocks, pool.block_size, pool.mib, seconds)
