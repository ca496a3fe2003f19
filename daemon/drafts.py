"""Draft models loaded beside a model for speculative decoding: its Modelfile's (DRAFT, at load) and those requests
name (option draft_model, loaded once per model and kept until it unloads), with the vocabulary check."""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Callable

from ..backends.base import ModelLoadError, Runner, RunnerSettings
from ..backends.choice import model_format
from ..backends.registry import backend_spec, specs
from .engine.draft_model import DraftVocabMismatch, check_vocab
from .model_types import (CannotServe, LoadedModel, LoadFailed, ModelRecord, NotFound, ShuttingDown, memory_size,
                          public_text)

log = logging.getLogger(__name__)


class Drafts:
    """Loads draft models with the manager's resolver and loader; concurrent requests for one draft share one load."""

    def __init__(self, resolve: Callable[[str], ModelRecord], loader: Callable[..., Runner],
                 notify: Callable[[dict], None] = lambda ev: None) -> None:
        self.resolve = resolve
        self.loader = loader
        self.notify = notify  # /api/events: a draft model a request loaded
        self._loading: dict[tuple[int, str], asyncio.Future[None]] = {}  # (model, draft): a load under way

    async def of_model(self, record: ModelRecord, backend: str, runner: Runner,
                          rs: RunnerSettings) -> tuple[Runner, int, str] | None:
        """The model's draft model (PARAMETER draft_model, from the Modelfile's DRAFT), its memory and store name;
        None when it names none. LoadFailed (the model's fault) for a draft that cannot serve it."""
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
        draft = await self._open(record.name, backend, runner, rs, draft_record, name)
        log.info("%s drafts with %s", record.name, name)
        return draft, memory_size(draft_record, draft), draft_record.name

    async def _open(self, target: str, backend: str, runner: Runner, rs: RunnerSettings,
                          draft_record: ModelRecord, name: str) -> Runner:
        """Load `draft_record` as a draft model of `runner` on `backend` (its slots and window); LoadFailed
        (model_fault) when the backend cannot read it, it does not load or it has another vocabulary."""
        spec = backend_spec(backend)
        if draft_record.remote is not None or not spec.reads(model_format(draft_record.path)):
            raise LoadFailed(f"the draft model {name!r} of {target!r} must be {spec.describe_formats()} (it runs "
                             f"on {backend}, beside the model)", model_fault=True)
        settings = dataclasses.replace(rs, max_num_seqs=runner.max_num_seqs, num_kv_blocks=None,
                                       projector_path=None)
        try:
            draft = await asyncio.to_thread(self.loader, backend, draft_record.path, settings)
        except ModelLoadError as e:
            raise LoadFailed(f"failed to load the draft model {name!r}: {public_text(str(e), draft_record.path)}",
                             model_fault=True) from None
        try:
            await asyncio.to_thread(check_vocab, runner, draft, target, name)
        except DraftVocabMismatch as e:
            await asyncio.to_thread(draft.close)
            raise LoadFailed(str(e), model_fault=True) from None
        return draft

    async def for_request(self, model: LoadedModel, name: str, still_loaded: Callable[[], bool]) -> str:
        """The draft model a request names (option draft_model), loaded beside `model` once and kept until it
        unloads; its store name ("" when it is the model's own Modelfile draft). NotFound, or CannotServe /
        LoadFailed saying why it cannot draft for this model."""
        try:
            record = self.resolve(name)
        except Exception as e:  # noqa: BLE001 - the resolver's error for an unknown name is a 404
            if getattr(e, "status", None) == 404:
                raise NotFound(f"draft model {name!r} not found") from None
            raise
        if model.draft is not None and record.name == model.draft_name:
            return ""  # the model's own (Modelfile) draft model: the default drafter
        if not backend_spec(model.backend).draft_model:
            raise CannotServe(f"model {model.name!r} cannot draft with {name!r}: draft models run on the "
                              f"{' and '.join(s.title for s in specs() if s.draft_model)} backend only (this model "
                              f"runs on {model.backend})")
        if model.settings is None:  # a model handed to the manager already loaded (tests): no settings to copy
            raise CannotServe(f"model {model.name!r} cannot load a draft model beside it")
        if (why := model.engine.cannot_draft()) is not None:
            raise CannotServe(f"model {model.name!r} cannot draft with {name!r}: {why}")
        key = (id(model), record.name)
        while record.name not in model.drafts:
            fut = self._loading.get(key)
            if fut is not None:  # another request is loading it: its outcome is ours
                await asyncio.shield(fut)
                continue
            fut = self._loading[key] = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()
            try:
                draft = await self._open(model.name, model.backend, model.runner, model.settings, record,
                                               name)
                if not still_loaded():  # the daemon stopped meanwhile
                    await asyncio.to_thread(draft.close)
                    raise ShuttingDown("server is shutting down")
                try:
                    model.engine.add_draft([record.name], draft)
                except ValueError as e:
                    await asyncio.to_thread(draft.close)
                    raise CannotServe(f"model {model.name!r} cannot draft with {name!r}: {e}") from None
                model.drafts[record.name] = draft
                model.size += memory_size(record, draft)
                log.info("%s drafts with %s for the requests that name it", model.name, record.name)
                self.notify({"type": "model", "event": "draft_loaded", "model": model.name, "draft": record.name,
                             "load_ms": (time.perf_counter() - t0) * 1e3, "size": model.size})
                fut.set_result(None)
            except BaseException as e:
                fut.set_exception(e if isinstance(e, Exception) else RuntimeError("load cancelled"))
                fut.exception()  # mark retrieved: waiters re-raise it themselves
                raise
            finally:
                self._loading.pop(key, None)
        return record.name
