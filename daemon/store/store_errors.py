"""Store exceptions; the HTTP layer maps each to a status (noted per class)."""
from __future__ import annotations

from .layout import DigestMismatch
from .names import InvalidDigest, InvalidName

__all__ = ["BlobNotFound", "DigestMismatch", "InvalidDigest", "InvalidModel", "InvalidName", "ModelNotFound",
           "NotSupported", "ReadOnlyModel", "StoreError"]


class StoreError(Exception):
    """Base class of store failures that are not a bad name or digest."""


class ModelNotFound(StoreError, LookupError):
    """No manifest for that name (404, message `model 'x' not found`)."""

    def __init__(self, name: str):
        super().__init__(f"model '{name}' not found")
        self.name = name


class BlobNotFound(StoreError, LookupError):
    """A digest named in a request or a manifest has no blob in any store (400 on create, 500 on load)."""

    def __init__(self, digest: str):
        super().__init__(f'blob "{digest}" not found')
        self.digest = digest


class ReadOnlyModel(StoreError, PermissionError):
    """The model lives in a read-only (Ollama) store; it can be read and copied, not deleted (403/400)."""


class NotSupported(StoreError):
    """A create option evenflow does not implement yet (adapters, quantization) (400)."""


class InvalidModel(StoreError, ValueError):
    """Bad create input: files, parameters, messages, template (400); the message names the bad value."""
