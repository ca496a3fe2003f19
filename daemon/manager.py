"""The model manager: loads models on first use, wraps each runner in an Engine, keep-alive timers, LRU eviction.

All loading runs off the event loop (asyncio.to_thread); concurrent requests for one model share one load.
A request holds a `Lease` while it runs; when the last lease of a model ends its keep-alive clock starts.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from typing import Callable

from ..backends.base import InsufficientMemory, ModelLoadError, Runner, RunnerSettings, auto_backend, load_runner
from ..backends.choice import total_vram
from ..backends.registry import backend_spec, specs
from ..backends.common.gpu_plan import default_context_length
from .settings import FOREVER, Settings
from .engine.engine import Engine, EngineConfig
from .engine.kv_disk import DiskKVCache
from .model_types import (Busy, CannotServe, GpuOptions, LoadedModel, LoadFailed, ModelRecord, ShuttingDown,
                          check_num_ctx, memory_size, model_gpu, model_num_ctx, public_text)
from .drafts import Drafts

log = logging.getLogger(__name__)


class Lease:
    """One request's hold on a loaded model and the window its sequence gets (`num_ctx`); `release()` (or
    `async with`) starts the keep-alive clock."""

    def __init__(self, manager: "ModelManager", model: LoadedModel, keep_alive: float, load_ns: int,
                 num_ctx: int) -> None:
        self.manager, self.model, self.keep_alive, self.load_duration_ns = manager, model, keep_alive, load_ns
        self.num_ctx = num_ctx
        self.draft_model = ""  # the request's draft model (its store name), loaded beside the model; "" = default
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
        self.drafts = Drafts(resolve, loader, self._notify)
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
                      gpu: GpuOptions | None = None, draft: str | None = None) -> Lease:
        """Resolve (unless given the record the request resolved already), load if needed (shared), and hold `name`
        for one request whose sequence gets `num_ctx` tokens (None: the model's default window; the lease says
        which) and drafts with the draft model `draft` (loaded beside it: `Drafts.for_request`); a ManagerError (or the
        resolver's) on failure."""
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
            model = await self._get_loaded(record, num_ctx, (gpu or GpuOptions()).over(model_gpu(record)))
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
        lease = Lease(self, model, keep, time.perf_counter_ns() - t0, window)
        if draft:
            try:
                loaded = lambda: self.models.get(model.name) is model  # noqa: E731
                lease.draft_model = await self.drafts.for_request(model, draft, loaded)
            except BaseException:
                lease.release()
                raise
            lease.load_duration_ns = time.perf_counter_ns() - t0
        return lease

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
        want = max(num_ctx or 0, model_num_ctx(record) or s.context_length or vram_default)
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
            draft = await self.drafts.of_model(record, backend, runner, rs)
        except BaseException:
            await asyncio.to_thread(runner.close)
            raise
        cfg = EngineConfig(prefill_mode=s.prefill, max_num_batched_tokens=step_cap,
                           max_num_seqs=self.slots, target_itl_ms=s.target_itl_ms, max_queue=s.max_queue,
                           context_length=ctx, speculative=s.speculative)
        engine = Engine(runner, cfg, name=record.name, kv_disk=self.kv_disk, model_id=model_identity(record.path),
                        draft=draft[0] if draft is not None else None)
        await asyncio.to_thread(engine.warm_disk_cache)
        engine.start()
        size = memory_size(record, runner) + (draft[1] if draft is not None else 0)
        model = LoadedModel(record, runner, engine, ctx, time.perf_counter_ns() - t0, size,
                            backend, gpu, draft[0] if draft is not None else None, rs,
                            draft_name=draft[2] if draft is not None else "", vram_default=vram_default)
        for fn in self._listeners:
            engine.subscribe(fn)
        self._notify({"type": "model", "event": "loaded", "model": record.name, "backend": backend,
                      "context_length": ctx, "load_ms": model.load_duration_ns / 1e6, "size": model.size,
                      "slots": engine.scheduler.slots.size, "kv_tokens": engine.blocks.num_blocks * engine.block_size,
                      "kv_layout": runner.kv_layout, "kv_types": runner.kv_types})
        log.info("loaded %s in %.2fs (%s, ctx %d; one sequence holds up to %d tokens)", record.name,
                 model.load_duration_ns / 1e9, backend, ctx, model.max_context)
        return model

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
        for runner in (model.runner, model.draft, *model.drafts.values()):
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


def _device(backend: str, device: str, gpu: GpuOptions) -> str:
    """The device for Ollama's options where they pick it (torch runs a model whole: num_gpu 0 = the CPU, main_gpu N
    = cuda:N, any other num_gpu the GPU; `BackendSpec.gpu_device`). llama.cpp reads num_gpu / main_gpu itself."""
    pattern = backend_spec(backend).gpu_device
    if pattern is None or device != "auto":
        return device
    if gpu.num_gpu == 0:
        return "cpu"
    return pattern.format(gpu.main_gpu) if gpu.main_gpu is not None else device
