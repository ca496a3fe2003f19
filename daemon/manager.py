"""The model manager: loads models on first use, wraps each runner in an Engine, keep-alive timers, LRU eviction.

All loading runs off the event loop (asyncio.to_thread); concurrent requests for one model share one load.
A request holds a `Lease` while it runs; when the last lease of a model ends its keep-alive clock starts.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..backends.base import InsufficientMemory, ModelLoadError, Runner, RunnerSettings, auto_backend, load_runner
from ..backends.choice import model_format, total_vram
from ..backends.registry import backend_spec, specs
from ..backends.common.gpu_plan import default_context_length
from .settings import FOREVER, Settings
from .engine.draft_model import DraftVocabMismatch, check_vocab
from .engine.engine import Engine, EngineConfig
from .engine.kv_disk import DiskKVCache

log = logging.getLogger(__name__)


class ManagerError(Exception):
    """A request the manager cannot serve; the API answers each kind with its HTTP status."""


class ShuttingDown(ManagerError):
    """The daemon is stopping: no new leases."""


class Busy(ManagerError):
    """As many requests as the daemon queues are already waiting for a model."""


class CannotServe(ManagerError):
    """The request asks what this model cannot give: a remote model here, a num_ctx over its trained window or over
    what this machine's memory can give one sequence."""


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
        return min(_model_num_ctx(self.record) or default_num_ctx or self.vram_default, self.trained_context)


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


def _model_gpu(record: ModelRecord) -> GpuOptions:
    """The model's PARAMETER num_gpu / main_gpu."""
    pick = lambda k: record.params.get(k) if isinstance(record.params.get(k), int) else None  # noqa: E731
    return GpuOptions(pick("num_gpu"), pick("main_gpu"))


def check_num_ctx(name: str, num_ctx: int | None, trained: int | None) -> None:
    """CannotServe for a num_ctx over the model's trained window (when known)."""
    if num_ctx is not None and trained and num_ctx > trained:
        raise CannotServe(f"num_ctx {num_ctx} exceeds the context length of model '{name}' ({trained} tokens); "
                          f"use num_ctx <= {trained}")


def _model_num_ctx(record: ModelRecord) -> int | None:
    """The model's PARAMETER num_ctx (Ollama's precedence: a request's num_ctx, then this, then the default)."""
    v = record.params.get("num_ctx")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


class Lease:
    """One request's hold on a loaded model and the window its sequence gets (`num_ctx`); `release()` (or
    `async with`) starts the keep-alive clock."""

    def __init__(self, manager: "ModelManager", model: LoadedModel, keep_alive: float, load_ns: int,
                 num_ctx: int) -> None:
        self.manager, self.model, self.keep_alive, self.load_duration_ns = manager, model, keep_alive, load_ns
        self.num_ctx = num_ctx
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.manager._release(self.model, self.keep_alive)

    async def __aenter__(self) -> "Lease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


Resolver = Callable[[str], ModelRecord]  # raises the caller's own errors for unknown or invalid names


class ModelManager:
    def __init__(self, settings: Settings, resolve: Resolver,
                 loader: Callable[[str, str, RunnerSettings], Runner] = load_runner) -> None:
        self.settings = settings
        self.resolve = resolve
        self.loader = loader
        self.models: dict[str, LoadedModel] = {}  # by display name
        self._loading: dict[str, asyncio.Future[LoadedModel]] = {}
        self._pending = 0  # requests waiting for a model (queue depth before the engine)
        self._closing = False
        self._listeners: list[Callable[[dict], None]] = []  # engine event subscribers, attached at load
        # cached prefixes outlive an unload or a restart (engine/kv_disk.py); None when the budget is 0
        self.kv_disk = DiskKVCache(settings.kv_cache_dir, settings.kv_cache_size) if settings.kv_cache_size > 0 \
            else None

    # ---- public ----
    @property
    def slots(self) -> int | None:
        """Concurrent sequences per model: OLLAMA_NUM_PARALLEL, else EVENFLOW_MAX_SEQS, else None: the runner
        takes as many as its KV pool holds, at least 8."""
        return self.settings.num_parallel or self.settings.max_seqs or None

    @property
    def pending(self) -> int:
        return self._pending

    def add_listener(self, fn: Callable[[dict], None]) -> None:
        """Subscribe `fn` to the events of every engine, present and future."""
        self._listeners.append(fn)
        for m in self.models.values():
            m.engine.subscribe(fn)

    async def acquire(self, name: str | ModelRecord, *, keep_alive: float | None = None, num_ctx: int | None = None,
                      gpu: GpuOptions | None = None) -> Lease:
        """Resolve (unless given the record the request resolved already), load if needed (shared), and hold `name`
        for one request whose sequence gets `num_ctx` tokens (None: the model's default window; the lease says
        which); a ManagerError (or the resolver's) on failure."""
        if self._closing:
            raise ShuttingDown("server is shutting down")
        record = name if isinstance(name, ModelRecord) else self.resolve(name)
        if record.remote is not None:
            raise CannotServe(f"model '{record.name}' is a remote model; this endpoint cannot serve it")
        check_num_ctx(record.name, num_ctx, record.context_length)  # before anything loads
        keep = self.settings.keep_alive if keep_alive is None else keep_alive
        if self._pending >= self.settings.max_queue:
            raise Busy(f"{self._pending} requests are already waiting for a model")
        self._pending += 1
        t0 = time.perf_counter_ns()
        try:
            model = await self._get_loaded(record, num_ctx, (gpu or GpuOptions()).over(_model_gpu(record)))
        finally:
            self._pending -= 1
        check_num_ctx(model.name, num_ctx, model.trained_context)  # the store may not have known the window
        # It was loaded for this window (or a larger one) when it cannot hold it: memory allowed no more.
        window = min(self._window(model, num_ctx), model.max_context)
        if num_ctx is not None and num_ctx > window:
            raise CannotServe(f"num_ctx {num_ctx} is more than one sequence of model '{model.name}' can hold in the "
                              f"KV cache this machine's memory allows ({window} tokens); use num_ctx <= {window}")
        model.active += 1
        model.last_used = time.monotonic()
        model.expires_at = math.inf
        if model.timer is not None:
            model.timer.cancel()
            model.timer = None
        return Lease(self, model, keep, time.perf_counter_ns() - t0, window)

    async def unload(self, name: str) -> bool:
        """Unload now if loaded (waits for in-flight requests to finish)."""
        model = self.models.get(name)
        if model is None:
            return False
        while model.active:
            await asyncio.sleep(0.02)
        if self.models.get(name) is model:
            await self._drop(model)
        return True

    def loaded(self) -> list[LoadedModel]:
        return list(self.models.values())

    async def abort_all(self) -> None:
        """Stop every engine now: running and queued sequences finish with done_reason "abort"."""
        self._closing = True
        await asyncio.gather(*(asyncio.to_thread(m.engine.shutdown, 10) for m in list(self.models.values())))

    async def shutdown(self) -> None:
        """Stop admitting, abort what runs, shut every engine down and free the models."""
        self._closing = True
        for fut in list(self._loading.values()):
            try:
                await fut
            except Exception:  # noqa: BLE001 - a failed load has nothing to free
                pass
        for model in list(self.models.values()):
            await self._drop(model)
        if self.kv_disk is not None:  # the prefixes the engines just handed over go to disk before we exit
            await asyncio.to_thread(self.kv_disk.close, 60)

    # ---- internals ----
    async def _get_loaded(self, record: ModelRecord, num_ctx: int | None, gpu: GpuOptions) -> LoadedModel:
        while True:
            fut = self._loading.get(record.name)
            if fut is not None:
                await asyncio.shield(fut)
                continue
            model = self.models.get(record.name)
            if model is not None and model.record.path == record.path and model.record != record:
                # Re-created with the same weights (/api/create of a loaded name): the next request uses the new
                # template, system and parameters; running requests keep what they were prepared with.
                log.info("%s was re-created: the loaded copy takes its new template and parameters", record.name)
                model.record = record
            why = None if model is None else self._reload_reason(model, record, num_ctx, gpu)
            if model is not None and why is None:
                return model
            fut = asyncio.get_running_loop().create_future()
            self._loading[record.name] = fut
            try:
                if model is not None:  # wait for its requests, then reload
                    log.info("reloading %s: %s", record.name, why)
                    while model.active:
                        await asyncio.sleep(0.02)
                    await self._drop(model)
                await self._make_room()
                loaded = await self._load(record, num_ctx, gpu)
                self.models[record.name] = loaded
                fut.set_result(loaded)
                return loaded
            except BaseException as e:
                fut.set_exception(e if isinstance(e, Exception) else RuntimeError("load cancelled"))
                fut.exception()  # mark retrieved: waiters re-raise it themselves
                raise
            finally:
                self._loading.pop(record.name, None)

    def _window(self, model: LoadedModel, num_ctx: int | None) -> int:
        """The window a request's sequence gets on `model`: its num_ctx, else the model's default."""
        return num_ctx if num_ctx is not None else model.default_window(self.settings.context_length)

    def _reload_reason(self, model: LoadedModel, record: ModelRecord, num_ctx: int | None,
                       gpu: GpuOptions) -> str | None:
        """Why the loaded `model` cannot serve this request as it is (None: it can). num_ctx is a per-sequence
        limit, so a client that varies it does not thrash loads: only a window one sequence cannot hold in the
        KV pool reloads, and only when the model was loaded for a smaller one (else memory is the limit)."""
        if model.record.path != record.path:
            return "its weights changed"
        if gpu.reloads(model.gpu):
            return f"{gpu} asked, loaded with {model.gpu}"
        window = self._window(model, num_ctx)
        if window > model.max_context and window > model.context_length:
            pool = model.engine.blocks.num_blocks * model.engine.block_size
            return (f"num_ctx {window} is more than one sequence can hold in its KV pool ({model.max_context} of "
                    f"{pool} tokens, {model.runner.kv_layout or 'paged'} layout, loaded for num_ctx "
                    f"{model.context_length})")
        return None

    async def _make_room(self) -> None:
        limit = self.settings.loaded_model_limit
        while len(self.models) >= limit:
            idle = [m for m in self.models.values() if m.active == 0]
            if idle:
                victim = min(idle, key=lambda m: m.last_used)
                log.info("evicting %s (least recently used; %d models loaded, limit %d)", victim.name,
                         len(self.models), limit)
                await self._drop(victim)
            else:
                await asyncio.sleep(0.05)

    async def _load(self, record: ModelRecord, num_ctx: int | None, gpu: GpuOptions) -> LoadedModel:
        s = self.settings
        backend = s.backend if s.backend != "auto" else auto_backend(record.path)
        # Ollama's default window by total VRAM (reference/ollama-api.md, num_ctx)
        vram_default = default_context_length(await asyncio.to_thread(total_vram, backend) if gpu.num_gpu != 0 else 0)
        # The pool holds the model's default window per slot, or the request's when larger: requests with or
        # without a num_ctx of their own then share the loaded model.
        want = max(num_ctx or 0, _model_num_ctx(record) or s.context_length or vram_default)
        if record.context_length:
            want = min(want, record.context_length)
        # Monolithic prefill puts a whole prompt in one forward: the backend's step limit must cover the window.
        step_cap = max(want, s.max_batched_tokens) if s.prefill == "monolithic" else s.max_batched_tokens
        spec = backend_spec(backend)
        rs = RunnerSettings(max_num_seqs=self.slots, context_length=want, max_num_batched_tokens=step_cap,
                            device=_device(backend, s.device, gpu), num_threads=s.num_threads or None,
                            num_gpu=gpu.num_gpu, main_gpu=gpu.main_gpu,
                            kv_memory_fraction=s.gpu_kv_fraction, kv_layout=s.llamacpp_kv,
                            flash_attention=s.flash_attention, kv_cache_type=s.kv_cache_type,
                            projector_path=record.projector if spec.vision else None)
        if s.kv_cache_type not in spec.kv_cache_types:
            log.warning("OLLAMA_KV_CACHE_TYPE=%s applies to the %s backend only; %s keeps its own KV type",
                        s.kv_cache_type, " and ".join(b.title for b in specs() if s.kv_cache_type in b.kv_cache_types),
                        backend)
        t0 = time.perf_counter_ns()
        log.info("loading %s from %s with %s (num_ctx %d, slots %s)", record.name, record.path, backend, want,
                 self.slots or "auto")
        try:
            runner = await asyncio.to_thread(self.loader, backend, record.path, rs)
        except InsufficientMemory as e:
            raise LoadFailed(f"failed to load model {record.name!r}: {public_text(str(e), record.path)}") from None
        except ModelLoadError as e:  # the model's files are bad or unsupported: the same answer every time
            raise LoadFailed(f"failed to load model {record.name!r}: {public_text(str(e), record.path)}",
                             model_fault=True) from None
        except (OSError, ValueError, RuntimeError):
            log.exception("loading %s with backend %s failed", record.name, backend)  # its text may hold paths
            raise LoadFailed(f"failed to load model {record.name!r} with backend {backend}: internal error "
                             f"(see the daemon log)") from None
        ctx = min(want, int(runner.info.context_length))
        try:
            draft = await self._load_draft(record, backend, runner, rs)
        except BaseException:
            await asyncio.to_thread(runner.close)
            raise
        cfg = EngineConfig(prefill_mode=s.prefill, max_num_batched_tokens=step_cap,
                           max_num_seqs=self.slots, target_itl_ms=s.target_itl_ms, max_queue=s.max_queue,
                           context_length=ctx, speculative=s.speculative)
        engine = Engine(runner, cfg, name=record.name, kv_disk=self.kv_disk, model_id=model_identity(record.path),
                        draft=draft)
        await asyncio.to_thread(engine.warm_disk_cache)
        engine.start()
        model = LoadedModel(record, runner, engine, ctx, time.perf_counter_ns() - t0, _memory_size(record, runner),
                            backend, gpu, draft, vram_default)
        for fn in self._listeners:
            engine.subscribe(fn)
        self._notify({"type": "model", "event": "loaded", "model": record.name, "backend": backend,
                      "context_length": ctx, "load_ms": model.load_duration_ns / 1e6, "size": model.size,
                      "slots": engine.scheduler.slots.size, "kv_tokens": engine.blocks.num_blocks * engine.block_size,
                      "kv_layout": runner.kv_layout, "kv_types": runner.kv_types})
        log.info("loaded %s in %.2fs (%s, ctx %d; one sequence holds up to %d tokens)", record.name,
                 model.load_duration_ns / 1e9, backend, ctx, model.max_context)
        return model

    async def _load_draft(self, record: ModelRecord, backend: str, runner: Runner, rs: RunnerSettings) -> Runner | None:
        """The model's draft model (PARAMETER draft_model, from the Modelfile's DRAFT), loaded with its slots and
        window; None when it names none. LoadFailed (the model's fault) for a draft that cannot serve it."""
        name = record.params.get("draft_model")
        if not name:
            return None
        spec = backend_spec(backend)
        if not spec.draft_model:
            raise LoadFailed(f"model {record.name!r} names the draft model {name!r}, but draft models run on the "
                             f"{' and '.join(s.title for s in specs() if s.draft_model)} backend only (this model runs "
                             f"on {backend})", model_fault=True)
        try:
            draft_record = self.resolve(name)
        except Exception as e:  # noqa: BLE001 - the resolver's own error says why (not found, invalid name)
            raise LoadFailed(f"the draft model {name!r} of {record.name!r}: {e}", model_fault=True) from None
        if draft_record.remote is not None or not spec.reads(model_format(draft_record.path)):
            raise LoadFailed(f"the draft model {name!r} of {record.name!r} must be {spec.describe_formats()} (it runs "
                             f"on {backend}, beside the model)", model_fault=True)
        settings = dataclasses.replace(rs, max_num_seqs=runner.max_num_seqs, num_kv_blocks=None,
                                       projector_path=None)
        try:
            draft = await asyncio.to_thread(self.loader, backend, draft_record.path, settings)
        except ModelLoadError as e:
            raise LoadFailed(f"failed to load the draft model {name!r}: {public_text(str(e), draft_record.path)}",
                             model_fault=True) from None
        try:
            await asyncio.to_thread(check_vocab, runner, draft, record.name, name)
        except DraftVocabMismatch as e:
            await asyncio.to_thread(draft.close)
            raise LoadFailed(str(e), model_fault=True) from None
        log.info("%s drafts with %s", record.name, name)
        return draft

    def _release(self, model: LoadedModel, keep_alive: float) -> None:
        model.active -= 1
        model.last_used = time.monotonic()
        model.keep_alive = keep_alive
        if model.active > 0 or self.models.get(model.name) is not model:
            return
        if keep_alive == FOREVER:
            model.expires_at = math.inf
            return
        model.expires_at = time.time() + keep_alive
        loop = asyncio.get_running_loop()
        if keep_alive <= 0:
            loop.create_task(self._expire(model))
        else:
            model.timer = loop.call_later(keep_alive, lambda: loop.create_task(self._expire(model)))

    async def _expire(self, model: LoadedModel) -> None:
        if model.active == 0 and self.models.get(model.name) is model and time.time() >= model.expires_at - 0.05:
            log.info("keep-alive expired: unloading %s", model.name)
            await self._drop(model)

    async def _drop(self, model: LoadedModel) -> None:
        if self.models.get(model.name) is model:
            del self.models[model.name]
        if model.timer is not None:
            model.timer.cancel()
        await asyncio.to_thread(_close, model)
        self._notify({"type": "model", "event": "unloaded", "model": model.name})

    def _notify(self, event: dict) -> None:
        event.setdefault("time", time.time())
        for fn in self._listeners:
            try:
                fn(event)
            except Exception:  # noqa: BLE001 - a listener must not break loading
                log.exception("model event listener failed")


def _close(model: LoadedModel) -> None:
    try:
        model.engine.shutdown(timeout=10)
    finally:
        for runner in (model.runner, model.draft):
            try:
                if runner is not None:
                    runner.close()
            except Exception:  # noqa: BLE001 - freeing must not fail the caller
                log.exception("closing a runner of %s failed", model.name)


def model_identity(path: str) -> str:
    """What names the weights in the disk KV cache's key: a store blob's digest, else the files' names, sizes and
    modification times."""
    base = os.path.basename(path.rstrip("/\\"))
    if base.startswith("sha256-"):
        return base
    try:
        files = [os.path.join(path, f) for f in sorted(os.listdir(path))] if os.path.isdir(path) else [path]
        return ";".join(f"{os.path.realpath(f)}:{st.st_size}:{st.st_mtime_ns}" for f in files
                        if os.path.isfile(f) and (st := os.stat(f)))
    except OSError:
        return os.path.realpath(path)


_BLOB_PATH = re.compile(r"(?:[^\s'\"]*[/\\])?blobs[/\\]sha256-([0-9a-fA-F]{64})")


def public_text(text: str, model_path: str) -> str:
    """A load error for a client: the model's store paths become its blob digest or its file names."""
    base = os.path.basename(model_path.rstrip("/\\"))
    if base.startswith("sha256-"):
        text = text.replace(model_path, "sha256:" + base[len("sha256-"):])
    else:  # a materialised HF folder: its files by their own names
        text = text.replace(model_path.rstrip("/\\") + os.sep, "").replace(model_path, "the model folder")
    return _BLOB_PATH.sub(lambda m: "sha256:" + m.group(1).lower(), text)


def _device(backend: str, device: str, gpu: GpuOptions) -> str:
    """The device for Ollama's options where they pick it (torch runs a model whole: num_gpu 0 = the CPU, main_gpu N
    = cuda:N, any other num_gpu the GPU; `BackendSpec.gpu_device`). llama.cpp reads num_gpu / main_gpu itself."""
    pattern = backend_spec(backend).gpu_device
    if pattern is None or device != "auto":
        return device
    if gpu.num_gpu == 0:
        return "cpu"
    return pattern.format(gpu.main_gpu) if gpu.main_gpu is not None else device


def _memory_size(record: ModelRecord, runner: Runner) -> int:
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
