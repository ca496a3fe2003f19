"""What a model is to the daemon: its store record, the loaded model (runner, engine, drafts, keep-alive state), the
load-time GPU options, and the errors the model manager answers with (the API maps each to a status)."""
from __future__ import annotations

import asyncio
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..backends.base import Runner, RunnerSettings


class ManagerError(Exception):
    """A request the manager cannot serve; the API answers each kind with its HTTP status."""


class ShuttingDown(ManagerError):
    """The daemon is stopping: no new leases."""


class Busy(ManagerError):
    """As many requests as the daemon queues are already waiting for a model."""


class CannotServe(ManagerError):
    """The request asks what this model cannot give: a remote model here, a num_ctx over its trained window or over
    what this machine's memory can give one sequence."""


class NotFound(ManagerError):
    """A model the request names besides its own (a draft model) is not in the store."""


class LoadFailed(ManagerError):
    """The model did not load; `model_fault` when its files are bad or unsupported (the same answer every time)."""

    def __init__(self, message: str, model_fault: bool = False) -> None:
        super().__init__(message)
        self.model_fault = model_fault


@dataclass
class ModelRecord:
    """What the manager and the API need from the store about one model."""

    name: str  # display name, e.g. "demo:latest"
    path: str  # weights file (GGUF blob) or HF directory
    template: str | None = None  # the store's TEMPLATE (Go template or Jinja), None = the model file's own
    system: str | None = None
    params: dict[str, Any] = field(default_factory=dict)  # Modelfile PARAMETERs (sampling defaults, stop)
    messages: list[dict[str, Any]] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    digest: str = ""
    context_length: int | None = None  # trained window if the store knows it
    size: int = 0
    bos_token: str | None = None  # special-token texts for Jinja templates
    eos_token: str | None = None
    synthetic: bool = False
    remote: dict[str, Any] | None = None  # served by an upstream engine (daemon/api/remote/), never loaded here
    projector: str | None = None  # vision projector GGUF (a projector layer): images in on llama.cpp


@dataclass
class LoadedModel:
    record: ModelRecord
    runner: Runner
    engine: Any  # evenflow.daemon.engine.Engine
    context_length: int  # the num_ctx it loaded with: a request without one gets its own default (`default_window`)
    load_duration_ns: int
    size: int
    backend: str
    gpu: "GpuOptions" = field(default_factory=lambda: GpuOptions())  # the num_gpu / main_gpu it loaded with
    draft: Runner | None = None  # the draft model's runner (speculative decoding, Modelfile DRAFT)
    settings: RunnerSettings | None = None  # what the runner loaded with (a request's draft model loads alike)
    drafts: dict[str, Runner] = field(default_factory=dict)  # draft models requests named, by store name
    draft_name: str = ""  # the store name of `draft`
    vram_default: int = 4096  # Ollama's default num_ctx for the GPU memory this model runs with
    active: int = 0
    keep_alive: float = 300.0
    expires_at: float = math.inf  # unix seconds; inf while in use or forever
    last_used: float = field(default_factory=time.monotonic)
    timer: asyncio.TimerHandle | None = None
    unsubscribe: Callable[[], None] | None = None

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def trained_context(self) -> int:
        return int(self.runner.info.context_length)

    @property
    def max_context(self) -> int:
        """The largest num_ctx a request gets without a reload: what one sequence can hold in the KV pool."""
        return int(self.engine.max_context)

    def default_window(self, default_num_ctx: int) -> int:
        """A request's window when it names no num_ctx: the model's PARAMETER num_ctx, else the daemon's
        OLLAMA_CONTEXT_LENGTH (`default_num_ctx`, 0 = unset), else Ollama's default by GPU memory; at most the
        trained window."""
        return min(model_num_ctx(self.record) or default_num_ctx or self.vram_default, self.trained_context)


@dataclass(frozen=True)
class GpuOptions:
    """Ollama's load-time GPU options: num_gpu (layers to offload; None or < 0 = as many as fit, 0 = CPU only) and
    main_gpu (which GPU). A change reloads the model, as in Ollama (`needsReload`); None leaves the loaded choice."""

    num_gpu: int | None = None
    main_gpu: int | None = None

    def over(self, base: "GpuOptions") -> "GpuOptions":
        """These options where set, else `base`'s (a request's over the model's PARAMETERs)."""
        return GpuOptions(base.num_gpu if self.num_gpu is None else self.num_gpu,
                          base.main_gpu if self.main_gpu is None else self.main_gpu)

    def reloads(self, loaded: "GpuOptions") -> bool:
        """Whether a model loaded with `loaded` must reload to honour these (num_gpu < 0 means auto: never)."""
        return ((self.num_gpu is not None and self.num_gpu >= 0 and self.num_gpu != loaded.num_gpu)
                or (self.main_gpu is not None and self.main_gpu != loaded.main_gpu))


def model_gpu(record: ModelRecord) -> GpuOptions:
    """The model's PARAMETER num_gpu / main_gpu."""
    pick = lambda k: record.params.get(k) if isinstance(record.params.get(k), int) else None  # noqa: E731
    return GpuOptions(pick("num_gpu"), pick("main_gpu"))


def check_num_ctx(name: str, num_ctx: int | None, trained: int | None) -> None:
    """CannotServe for a num_ctx over the model's trained window (when known)."""
    if num_ctx is not None and trained and num_ctx > trained:
        raise CannotServe(f"num_ctx {num_ctx} exceeds the context length of model '{name}' ({trained} tokens); "
                          f"use num_ctx <= {trained}")


def model_num_ctx(record: ModelRecord) -> int | None:
    """The model's PARAMETER num_ctx (Ollama's precedence: a request's num_ctx, then this, then the default)."""
    v = record.params.get("num_ctx")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


_BLOB_PATH = re.compile(r"(?:[^\s'\"]*[/\\])?blobs[/\\]sha256-([0-9a-fA-F]{64})")


def public_text(text: str, model_path: str) -> str:
    """A load error for a client: the model's store paths become its blob digest or its file names."""
    base = os.path.basename(model_path.rstrip("/\\"))
    if base.startswith("sha256-"):
        text = text.replace(model_path, "sha256:" + base[len("sha256-"):])
    else:  # a materialised HF folder: its files by their own names
        text = text.replace(model_path.rstrip("/\\") + os.sep, "").replace(model_path, "the model folder")
    return _BLOB_PATH.sub(lambda m: "sha256:" + m.group(1).lower(), text)


def memory_size(record: ModelRecord, runner: Runner) -> int:
    """Weights file plus the KV pool (what `ollama ps` calls size)."""
    weights = record.size
    if not weights:
        try:
            weights = os.path.getsize(record.path) if os.path.isfile(record.path) else 0
        except OSError:
            weights = 0
    info = runner.info
    head_dim = info.embedding_length // max(info.head_count, 1)
    kv = 2 * info.block_count * info.head_count_kv * head_dim * runner.num_kv_blocks * runner.block_size * 2
    return int(weights + kv)
