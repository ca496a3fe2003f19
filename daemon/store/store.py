"""ModelStore: Ollama's on-disk layout (manifests + sha256 blobs), our writable root plus read-only Ollama stores.

Read-only stores (e.g. `~/.ollama/models`) are listed and served in place and never written: deleting one
of their models raises ReadOnlyModel; copying or creating `from` one writes the new manifest into OUR store,
referencing the blobs where they are (blob lookups search our root first, then the read-only roots).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterable, Iterable, Iterator

from .download import DownloadManager
from .store_errors import BlobNotFound, InvalidModel, ModelNotFound, ReadOnlyModel
from .hfdir import HF_DIR, materialize_dir
from .layout import PRUNE_GRACE_S, TMP_PREFIX, StoreLayout, atomic_write_bytes, fsync_dir
from .manifest import (MT_FILE, MT_LICENSE, MT_MESSAGES, MT_MODEL, MT_PARAMS, MT_PROJECTOR, MT_PROMPT, MT_SYSTEM, MT_TEMPLATE,
                       Manifest, ManifestError, ModelConfig)
from .names import ModelName, parse_name
from .records import ModelEntry, ResolvedModel, rfc3339
from .weight_info import WeightsError, WeightsInfo, read_gguf, read_hf

log = logging.getLogger(__name__)

@dataclass
class _Found:
    name: ModelName  # with the on-disk casing
    path: Path
    layout: StoreLayout
    read_only: bool


def _older(path: Path, cutoff: float) -> bool:
    try:
        return path.stat().st_mtime < cutoff
    except OSError:
        return False


class ModelStore:
    """Models in Ollama's layout under `root` (writable) plus `readonly_roots` (existing Ollama stores)."""

    def __init__(self, root: Path | str, readonly_roots: Iterable[Path | str] = ()):
        self.layout = StoreLayout(root)
        self.root = self.layout.root
        self.readonly = [StoreLayout(r) for r in readonly_roots if Path(r).expanduser() != self.root]
        self._lock = threading.RLock()  # create/copy/delete/GC are serialised within the daemon
        self.downloads = DownloadManager(self.layout)  # pulls of one blob share one download
        self.layout.manifests.mkdir(parents=True, exist_ok=True)
        self.layout.blobs.mkdir(parents=True, exist_ok=True)
        removed = self.layout.clean_temp_files()
        if removed:
            log.info("removed %d leftover temporary file(s) from an interrupted write", removed)

    # ------------------------------------------------------------------------------------------ blobs

    def has_blob(self, digest: str) -> bool:
        """True if any store (ours or read-only) holds the blob; raises InvalidDigest on a bad digest."""
        return any(lay.has_blob(digest) for lay in (self.layout, *self.readonly))

    def blob_path(self, digest: str) -> Path:
        """Where the blob lives (our store first); raises BlobNotFound."""
        for lay in (self.layout, *self.readonly):
            p = lay.blob_path(digest)
            if p.is_file():
                return p
        raise BlobNotFound(digest)

    def claim_blob(self, digest: str) -> bool:
        """has_blob for a client about to create from it: our own copy is marked recent so that a restart before
        the create does not prune it (see prune_unreferenced)."""
        return self.layout.touch_blob(digest) or self.has_blob(digest)

    def write_blob(self, digest: str, chunks: Iterable[bytes]) -> bool:
        """Stream bytes into our store, verifying sha256; True if created, False if it already existed."""
        if self.has_blob(digest):
            for _ in chunks:
                pass
            return False
        return self.layout.write_blob(digest, chunks)

    async def write_blob_async(self, digest: str, chunks: AsyncIterable[bytes]) -> bool:
        """Async twin of write_blob (DigestMismatch leaves nothing behind)."""
        if self.has_blob(digest):
            async for _ in chunks:
                pass
            return False
        return await self.layout.write_blob_async(digest, chunks)

    def add_blob_file(self, path: Path | str) -> str:
        """Copy a local file in as a blob; returns `sha256:<hex>`."""
        return self.layout.add_blob_file(path)

    def add_blob_bytes(self, data: bytes) -> str:
        return self.layout.write_blob_bytes(data)

    def read_blob(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    # ------------------------------------------------------------------------------------------ manifests

    def _manifest_files(self, layout: StoreLayout) -> Iterator[Path]:
        base = layout.manifests
        if not base.is_dir():
            return
        for p in sorted(base.glob("*/*/*/*")):
            if p.is_file() and not p.name.startswith(TMP_PREFIX) and not p.name.startswith("."):
                yield p

    def _name_of(self, layout: StoreLayout, path: Path) -> ModelName | None:
        host, ns, model, tag = path.relative_to(layout.manifests).parts
        try:
            name = parse_name(f"{host}/{ns}/{model}:{tag}")
        except ValueError:
            log.warning("ignoring manifest with an invalid name: %s", path)
            return None
        return name

    def _find(self, name: str | ModelName) -> _Found | None:
        """Locate a manifest, matching every part case-insensitively (our store wins over read-only ones)."""
        mn = parse_name(name) if isinstance(name, str) else name
        for layout, ro in ((self.layout, False), *((r, True) for r in self.readonly)):
            exact = layout.manifest_path(mn)
            if exact.is_file():
                return _Found(mn, exact, layout, ro)
            cur = layout.manifests
            for part in mn.parts:
                try:
                    match = next((c for c in os.listdir(cur) if c.lower() == part.lower()), None)
                except OSError:
                    match = None
                if match is None:
                    break
                cur = cur / match
            else:
                if cur.is_file():
                    found = self._name_of(layout, cur)
                    if found is not None:
                        return _Found(found, cur, layout, ro)
        return None

    def exists(self, name: str) -> bool:
        return self._find(name) is not None

    def _require(self, name: str | ModelName) -> _Found:
        found = self._find(name)
        if found is None:
            raise ModelNotFound(name.display() if isinstance(name, ModelName) else str(name))
        return found

    def _load(self, found: _Found) -> tuple[Manifest, bytes]:
        data = found.path.read_bytes()
        try:
            return Manifest.from_bytes(data), data
        except ManifestError as e:
            raise InvalidModel(f"manifest of '{found.name.display()}' is corrupt: {e}") from e

    def manifest(self, name: str) -> Manifest:
        return self._load(self._require(name))[0]

    def config(self, manifest: Manifest) -> ModelConfig:
        try:
            return ModelConfig.from_bytes(self.read_blob(manifest.config.digest))
        except BlobNotFound:
            return ModelConfig()

    def _details(self, manifest: Manifest, cfg: ModelConfig | None = None) -> dict[str, Any]:
        cfg = cfg or self.config(manifest)
        fmt = cfg.model_format or ("safetensors" if manifest.find(MT_FILE) else "gguf")
        return {"parent_model": "", "format": fmt, "family": cfg.model_family,
                "families": list(cfg.model_families) or ([cfg.model_family] if cfg.model_family else None),
                "parameter_size": cfg.model_type, "quantization_level": cfg.file_type}

    # ------------------------------------------------------------------------------------------ listing

    def list(self) -> list[ModelEntry]:
        """Every model (ours, then read-only stores not shadowed by ours), newest first."""
        seen: set[tuple[str, ...]] = set()
        out: list[ModelEntry] = []
        for layout, ro in ((self.layout, False), *((r, True) for r in self.readonly)):
            for path in self._manifest_files(layout):
                name = self._name_of(layout, path)
                if name is None or name.key() in seen:
                    continue
                try:
                    data = path.read_bytes()
                    manifest = Manifest.from_bytes(data)
                    mtime = path.stat().st_mtime_ns
                except (OSError, ManifestError) as e:
                    log.warning("skipping unreadable manifest %s: %s", path, e)
                    continue
                seen.add(name.key())
                out.append(ModelEntry(name.display(), name.display(), rfc3339(mtime), manifest.size,
                                      hashlib.sha256(data).hexdigest(), self._details(manifest), ro, mtime))
        out.sort(key=lambda e: e.mtime_ns, reverse=True)
        return out

    # ------------------------------------------------------------------------------------------ resolve

    def weights_info(self, manifest: Manifest, model_path: Path | None = None, full: bool = False) -> WeightsInfo:
        """Metadata of the model's weights (GGUF header or HF config), cached per blob."""
        layer = manifest.first(MT_MODEL)
        try:
            if layer is not None:
                return read_gguf(self.blob_path(layer.digest), full=full)
            files = {lay.name: self.blob_path(lay.digest) for lay in manifest.find(MT_FILE) if lay.name}
            return read_hf(files)
        except WeightsError as e:
            raise InvalidModel(str(e)) from e

    def resolve(self, name: str) -> ResolvedModel:
        """Everything to load and prompt `name`; raises ModelNotFound, InvalidName, InvalidModel, BlobNotFound."""
        # jinja2 only here: the CLI imports the store without it
        from ..prompt.templates import template_capabilities  # noqa: PLC0415

        found = self._require(name)
        manifest, data = self._load(found)
        digest = hashlib.sha256(data).hexdigest()
        cfg = self.config(manifest)
        if isinstance(cfg.extra.get("remote"), dict):
            return self._resolve_remote(found, manifest, digest, cfg)
        model_layer = manifest.first(MT_MODEL)
        if model_layer is not None:
            model_path, fmt = self.blob_path(model_layer.digest), "gguf"
        elif manifest.find(MT_FILE):
            model_path, fmt = self.materialize_hf(manifest, digest), "safetensors"
        else:
            kinds = sorted({lay.media_type for lay in manifest.layers})
            raise InvalidModel(f"model '{found.name.display()}' has no weights evenflow can load "
                               f"(layers: {', '.join(kinds) or 'none'}; need a GGUF model layer or HF files)")
        info = self.weights_info(manifest)
        layer_template = self.layer_text(manifest, MT_TEMPLATE, MT_PROMPT)
        template = layer_template or info.chat_template
        details = self._details(manifest, cfg)
        arch = info.architecture
        ctx = info.metadata.get(f"{arch}.context_length") or info.metadata.get(f"{arch}.max_position_embeddings")
        caps = ["embedding"] if info.is_embedding else ["completion"]
        caps += template_capabilities(template, info.family)
        projector = manifest.first(MT_PROJECTOR)
        if projector is not None:
            caps.append("vision")
        mtime = found.path.stat().st_mtime_ns
        return ResolvedModel(
            name=found.name.display(), full_name=found.name.full(), digest=digest, model_path=model_path,
            format=fmt, template=template, system=self.layer_text(manifest, MT_SYSTEM), params=self.layer_json(manifest, MT_PARAMS, {}),
            messages=self.layer_json(manifest, MT_MESSAGES, []), license=self.licenses(manifest), details=details,
            synthetic=info.synthetic, read_only=found.read_only, template_from_weights=template is not None and not layer_template,
            bos_token=info.bos_token, eos_token=info.eos_token, context_length=int(ctx) if isinstance(ctx, (int, float)) else None,
            capabilities=caps, modified_at=rfc3339(mtime), size=manifest.size,
            projector_path=self.blob_path(projector.digest) if projector is not None else None,
        )

    def remote(self, name: str) -> dict[str, Any] | None:
        """A remote model's endpoint (the config blob's `remote`), None for a local model."""
        manifest = self._load(self._require(name))[0]
        remote = self.config(manifest).extra.get("remote")
        return remote if isinstance(remote, dict) else None

    def _resolve_remote(self, found: _Found, manifest: Manifest, digest: str, cfg: ModelConfig) -> ResolvedModel:
        return ResolvedModel(
            name=found.name.display(), full_name=found.name.full(), digest=digest, model_path=Path(), format="remote",
            template=None, system=self.layer_text(manifest, MT_SYSTEM), params=self.layer_json(manifest, MT_PARAMS, {}),
            messages=self.layer_json(manifest, MT_MESSAGES, []), license=self.licenses(manifest),
            details=self._details(manifest, cfg), synthetic=False, read_only=found.read_only,
            capabilities=["completion", "tools"], modified_at=rfc3339(found.path.stat().st_mtime_ns),
            size=manifest.size, remote=dict(cfg.extra["remote"]))

    def layer_text(self, manifest: Manifest, *media_types: str) -> str | None:
        """Text of the first layer of one of `media_types` (TEMPLATE, SYSTEM, ...), or None."""
        layer = manifest.first(*media_types)
        return self.read_blob(layer.digest).decode("utf-8", errors="replace") if layer else None

    def layer_json(self, manifest: Manifest, media_type: str, default: Any) -> Any:
        """Parsed JSON of the first `media_type` layer (params, messages); `default` if absent or malformed."""
        layer = manifest.first(media_type)
        if layer is None:
            return default
        try:
            value = json.loads(self.read_blob(layer.digest))
        except ValueError:
            log.warning("layer %s (%s) is not JSON; ignoring it", layer.digest, media_type)
            return default
        return value if isinstance(value, type(default)) else default

    def licenses(self, manifest: Manifest) -> list[str]:
        return [self.read_blob(lay.digest).decode("utf-8", errors="replace") for lay in manifest.find(MT_LICENSE)]

    def materialize_hf(self, manifest: Manifest, digest: str) -> Path:
        """An HF folder of links to the blobs under `evenflow-hf/<manifest digest>/`, built atomically."""
        files = {layer.name or "": self.blob_path(layer.digest) for layer in manifest.find(MT_FILE)}
        return materialize_dir(self.root / HF_DIR / digest, files)

    # ------------------------------------------------------------------------------------------ changes

    def _target_name(self, name: str | ModelName) -> ModelName:
        """Parse a destination name, reusing the casing of an existing model in OUR store (Ollama does so)."""
        mn = parse_name(name) if isinstance(name, str) else name
        found = self._find(mn)
        return found.name if found is not None and not found.read_only else mn

    def write_manifest(self, name: str | ModelName, manifest: Manifest) -> str:
        """Atomically write a manifest into our store; returns its digest (hex)."""
        data = manifest.to_bytes()
        self.write_manifest_bytes(name, data)
        return hashlib.sha256(data).hexdigest()

    def write_manifest_bytes(self, name: str | ModelName, data: bytes) -> set[str]:
        """Write manifest bytes verbatim (a pull keeps the registry's); returns the blobs pruned with the old one."""
        manifest = Manifest.from_bytes(data)
        mn = self._target_name(name)
        path = self.layout.manifest_path(mn)
        with self._lock:  # delete's blob GC holds the same lock: no layer can vanish between check and write
            for digest in sorted(manifest.digests()):
                if not self.has_blob(digest):
                    raise BlobNotFound(digest)
            old = self._replaced(path)
            atomic_write_bytes(path, data)
            if old is None:
                return set()
            # layers only the replaced manifest used are pruned, as Ollama does
            return self._gc(old[0].digests() - manifest.digests(), old[1])

    def manifest_bytes(self, name: str | ModelName) -> bytes:
        """The raw manifest file of a model (ModelNotFound if absent)."""
        return self._require(name).path.read_bytes()

    def copy(self, src: str, dst: str) -> None:
        """Copy a model (read-only sources included) to `dst` in our store: the same manifest bytes."""
        dst_name = parse_name(dst)
        found = self._require(src)
        data = found.path.read_bytes()
        path = self.layout.manifest_path(self._target_name(dst_name))
        with self._lock:
            old = self._replaced(path)
            atomic_write_bytes(path, data)
            if old is not None:
                self._gc(old[0].digests(), old[1])

    def _replaced(self, path: Path) -> tuple[Manifest, str] | None:
        """The manifest about to be overwritten at `path` (and its digest), if any and readable."""
        try:
            data = path.read_bytes()
            return Manifest.from_bytes(data), hashlib.sha256(data).hexdigest()
        except (OSError, ManifestError):
            return None

    def delete(self, name: str) -> None:
        """Delete a model from our store, then the blobs only it referenced and empty folders."""
        with self._lock:
            found = self._require(name)
            if found.read_only:
                raise ReadOnlyModel(f"model '{found.name.display()}' is in the read-only Ollama store at "
                                    f"{found.layout.root}; evenflow never deletes from it (use `ollama rm`)")
            manifest, data = self._load(found)
            found.path.unlink()
            fsync_dir(found.path.parent)
            self._prune_dirs(found.path.parent)
            self._gc(manifest.digests(), hashlib.sha256(data).hexdigest())

    def _referenced(self) -> tuple[set[str], set[str]]:
        digests, manifests = set(), set()
        for path in self._manifest_files(self.layout):
            try:
                data = path.read_bytes()
                digests |= Manifest.from_bytes(data).digests()
                manifests.add(hashlib.sha256(data).hexdigest())
            except (OSError, ManifestError):
                log.warning("unreadable manifest %s kept its blobs", path)
                return {"*"}, manifests  # be safe: collect nothing
        return digests, manifests

    def _gc(self, candidates: set[str], manifest_digest: str) -> set[str]:
        used, manifests = self._referenced()
        if "*" in used:
            return set()
        removed = set()
        for digest in candidates - used:
            p = self.layout.blob_path(digest)
            if p.is_file():
                p.unlink()
                removed.add(digest)
                log.info("removed unused blob %s", digest)
        if manifest_digest not in manifests:
            shutil.rmtree(self.root / HF_DIR / manifest_digest, ignore_errors=True)
        fsync_dir(self.layout.blobs)
        return removed

    def prune_unreferenced(self, grace_s: float = PRUNE_GRACE_S) -> int:
        """Delete our blobs (and materialised HF folders) that no manifest references: what interrupted creates
        and uploads left, as Ollama prunes at start-up. Returns how many blobs went; nothing if a manifest is
        unreadable. Only for start-up, and only blobs untouched for `grace_s`: a blob uploaded (or checked with
        HEAD) for a create still to come is unreferenced too, and a restart in between must not lose it."""
        with self._lock:
            used, manifests = self._referenced()
            if "*" in used:
                return 0
            used_hex = {d.split(":", 1)[-1].lower() for d in used}
            removed = 0
            cutoff = time.time() - grace_s
            for p in self.layout.blobs.glob("sha256-*"):
                if p.is_file() and p.name[len("sha256-"):].lower() not in used_hex and _older(p, cutoff):
                    p.unlink()
                    removed += 1
            hf = self.root / HF_DIR
            if hf.is_dir():
                for d in hf.iterdir():
                    if d.name not in manifests:
                        shutil.rmtree(d, ignore_errors=True)
            if removed:
                fsync_dir(self.layout.blobs)
            return removed

    def _prune_dirs(self, start: Path) -> None:
        cur = start
        while cur != self.layout.manifests and self.layout.manifests in cur.parents:
            try:
                cur.rmdir()
            except OSError:
                break
            cur = cur.parent
