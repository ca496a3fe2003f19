"""The model store: Ollama's on-disk layout (manifests + sha256 blobs), atomic writes, read-only Ollama stores.

    store = ModelStore(default_store_root(), default_readonly_roots())
    store.write_blob("sha256:...", chunks)            # verifies while streaming; DigestMismatch leaves nothing
    for status in create_model(store, "m", files={"m.gguf": "sha256:..."}, template=..., parameters={...}): ...
    store.list() -> [ModelEntry]; store.resolve("m") -> ResolvedModel; show_model(store, "m") -> dict
    store.copy("m", "n"); store.delete("n")

Errors map to HTTP: InvalidName/InvalidDigest/DigestMismatch/InvalidModel/NotSupported/BlobNotFound -> 400,
ModelNotFound -> 404, ReadOnlyModel -> 403.
"""
from .create import create_model
from .demo import create_demo_model, ensure_demo_model
from .store_errors import BlobNotFound, InvalidModel, ModelNotFound, NotSupported, ReadOnlyModel, StoreError
from .layout import DigestMismatch, default_readonly_roots, default_store_root
from .modelfile import ModelfileError, ModelfileSpec, format_params, parse_modelfile
from .names import InvalidDigest, InvalidName, ModelName, parse_digest, parse_name
from .show import show_model
from .store import ModelEntry, ModelStore, ResolvedModel
from .weight_info import human_number

__all__ = [
    "BlobNotFound", "DigestMismatch", "InvalidDigest", "InvalidModel", "InvalidName", "ModelEntry", "ModelName",
    "ModelNotFound", "ModelStore", "ModelfileError", "ModelfileSpec", "NotSupported", "ReadOnlyModel",
    "ResolvedModel", "StoreError", "create_demo_model", "create_model", "default_readonly_roots", "default_store_root",
    "ensure_demo_model", "format_params", "human_number", "parse_digest", "parse_modelfile", "parse_name",
    "show_model",
]
