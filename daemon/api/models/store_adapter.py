"""The API's view of `daemon/store`: ModelStore calls with store exceptions mapped to HTTP statuses."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, AsyncIterable, Callable, Iterator

from ...settings import Settings
from ...model_types import ModelRecord
from ...store import store_errors as se
from ...store import create_model, ensure_demo_model, hfpull, registry, show_model
from ...store.manifest import ManifestError
from ...store.names import parse_name
from ...store.store import ModelStore
from ..http.errors import APIError

log = logging.getLogger(__name__)


@contextlib.contextmanager
def store_errors(name: str = "") -> Iterator[None]:
    """Store exceptions -> APIError with Ollama's statuses and messages."""
    try:
        yield
    except APIError:
        raise
    except se.ModelNotFound as e:
        raise APIError(404, str(e)) from None
    except se.InvalidName as e:
        raise APIError(400, str(e) or "invalid model name") from None
    except se.InvalidDigest as e:
        raise APIError(400, str(e)) from None
    except se.DigestMismatch as e:
        raise APIError(400, str(e)) from None
    except se.BlobNotFound as e:
        raise APIError(400, str(e)) from None
    except se.ReadOnlyModel as e:
        raise APIError(403, str(e)) from None
    except (se.NotSupported, se.InvalidModel, ManifestError) as e:
        raise APIError(400, str(e)) from None
    except ValueError as e:  # template errors and other bad input from the request
        raise APIError(400, str(e)) from None


class StoreAdapter:
    def __init__(self, store: Any) -> None:
        self.store = store

    def list_models(self) -> list[dict[str, Any]]:
        with store_errors():
            entries = self.store.list()
        return [e.to_json() for e in entries]

    def show(self, name: str, verbose: bool = False, system: str | None = None) -> dict[str, Any]:
        with store_errors(name):
            return show_model(self.store, name, verbose=verbose, system=system)

    def resolve(self, name: str) -> ModelRecord:
        if not name:
            raise APIError(400, "model is required")  # Ollama's answer, before any lookup
        with store_errors(name):
            r = self.store.resolve(name)
        return ModelRecord(name=r.name, path=str(r.model_path), template=r.template, system=r.system,
                           params=dict(r.params or {}), messages=list(r.messages or []), details=dict(r.details or {}),
                           digest=r.digest, context_length=r.context_length, size=r.size,
                           bos_token=r.bos_token, eos_token=r.eos_token, synthetic=r.synthetic, remote=r.remote,
                           projector=str(r.projector_path) if r.projector_path is not None else None)

    def create_iter(self, name: str, req: Any) -> Iterator[str]:
        """Validates (raising APIError) and returns the iterator of status lines that performs the create."""
        kwargs: dict[str, Any] = {
            "from_": req.from_, "files": req.files, "adapters": req.adapters, "template": req.template,
            "system": req.system, "license": req.license, "parameters": req.parameters,
            "messages": [m.as_template_dict() for m in req.messages] if req.messages else None,
            "quantize": req.quantize or req.quantization,
        }
        with store_errors(name):
            it = create_model(self.store, name, **{k: v for k, v in kwargs.items() if v is not None})
        return _mapped(it, name)

    def pull_iter(self, name: str, insecure: bool) -> Iterator[dict[str, Any]]:
        """Validates the name (APIError 400) and returns the iterator of progress lines that performs the pull."""
        with store_errors(name):
            mn = parse_name(name)
            return hfpull.pull_hf(self.store, mn) if hfpull.is_hf_name(mn) else registry.pull(self.store, name,
                                                                                               insecure)

    def push_iter(self, name: str, insecure: bool) -> Iterator[dict[str, Any]]:
        """Validates the name and that the model exists (400/404); the iterator uploads it."""
        with store_errors(name):
            return registry.push(self.store, name, insecure)

    def copy(self, src: str, dst: str) -> None:
        with store_errors(src):
            self.store.copy(src, dst)

    def delete(self, name: str) -> None:
        with store_errors(name):
            self.store.delete(name)

    def has_blob(self, digest: str) -> bool:
        """Whether the blob is there; a client asking is about to create from it (see ModelStore.claim_blob)."""
        with store_errors():
            return self.store.claim_blob(digest)

    async def write_blob(self, digest: str, chunks: AsyncIterable[bytes]) -> bool:
        with store_errors():
            return await self.store.write_blob_async(digest, chunks)

    def prune(self) -> None:
        """Start-up: remove blobs left unreferenced by interrupted creates and uploads (OLLAMA_NOPRUNE skips it)."""
        removed = self.store.prune_unreferenced()
        if removed:
            log.info("removed %d unreferenced blob(s) left by interrupted creates or uploads over a day ago", removed)

    def ensure_demo(self) -> None:
        """First start with an empty store: create the synthetic `demo` model (labelled synthetic in /api/show)."""
        if ensure_demo_model(self.store):
            log.info("empty model store: created the synthetic demo model")


def _mapped(it: Iterator[str], name: str) -> Iterator[str]:
    while True:
        with store_errors(name):
            try:
                item = next(it)
            except StopIteration:
                return
        yield item


def make_store(settings: Settings) -> StoreAdapter:
    readonly: list[Path] = []
    if settings.ollama_store is not None and (Path(settings.ollama_store) / "manifests").is_dir():
        readonly.append(Path(settings.ollama_store))
    return StoreAdapter(ModelStore(settings.models, readonly))


def record_resolver(adapter: StoreAdapter) -> Callable[[str], ModelRecord]:
    return adapter.resolve
