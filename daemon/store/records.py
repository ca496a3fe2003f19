"""What the store hands out: /api/tags rows and resolved models."""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def rfc3339(ts_ns: int) -> str:
    """Nanosecond timestamp -> RFC3339Nano in UTC (`2023-08-04T19:22:45.499127123Z`)."""
    secs, nanos = divmod(ts_ns, 1_000_000_000)
    return _dt.datetime.fromtimestamp(secs, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


@dataclass
class ModelEntry:
    """One /api/tags row."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str  # sha256 hex of the manifest bytes, no prefix
    details: dict[str, Any]
    read_only: bool = False
    mtime_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "modified_at": self.modified_at, "size": self.size,
                "digest": self.digest, "details": self.details}


@dataclass
class ResolvedModel:
    """Everything needed to load and prompt a model."""

    name: str  # display name, e.g. demo:latest
    full_name: str  # registry.ollama.ai/library/demo:latest
    digest: str  # manifest sha256 hex
    model_path: Path  # GGUF blob, or a materialised HF folder
    format: str  # gguf | safetensors
    template: str | None  # TEMPLATE layer, else the chat template inside the weights, else None
    system: str | None
    params: dict[str, Any]
    messages: list[dict[str, Any]]
    license: list[str]
    details: dict[str, Any]
    synthetic: bool
    read_only: bool
    template_from_weights: bool = False  # True when `template` came from the weights, not a TEMPLATE layer
    bos_token: str | None = None
    eos_token: str | None = None
    context_length: int | None = None
    capabilities: list[str] = field(default_factory=list)
    modified_at: str = ""
    size: int = 0
    remote: dict[str, Any] | None = None  # a remote model's endpoint (RemoteEndpoint.to_json); no weights then
    projector_path: Path | None = None  # the vision projector GGUF (a projector layer), None without vision
