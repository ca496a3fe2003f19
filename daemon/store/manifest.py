"""Ollama's manifest JSON (Docker v2 schema 2 shape) and its config blob (model.ConfigV2)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .names import parse_digest

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
MT_MODEL = "application/vnd.ollama.image.model"
MT_TEMPLATE = "application/vnd.ollama.image.template"
MT_PROMPT = "application/vnd.ollama.image.prompt"  # legacy alias of the template layer
MT_SYSTEM = "application/vnd.ollama.image.system"
MT_PARAMS = "application/vnd.ollama.image.params"
MT_MESSAGES = "application/vnd.ollama.image.messages"
MT_LICENSE = "application/vnd.ollama.image.license"
MT_ADAPTER = "application/vnd.ollama.image.adapter"
MT_PROJECTOR = "application/vnd.ollama.image.projector"
MT_EMBED = "application/vnd.ollama.image.embed"
MT_FILE = "application/vnd.evenflow.file"  # one file of an HF (safetensors) model; `name` = filename


class ManifestError(ValueError):
    """A manifest file that is not valid JSON of the expected shape."""


@dataclass
class Layer:
    """One blob referenced by a manifest."""

    media_type: str
    digest: str  # sha256:<hex>
    size: int
    name: str | None = None  # filename, for MT_FILE layers (Ollama's tensor layers use `name` too)
    from_: str | None = None  # Ollama's `from` (parent blob/model), kept verbatim

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.from_:
            out["from"] = self.from_
        if self.name:
            out["name"] = self.name
        return out

    @classmethod
    def from_json(cls, obj: Any) -> "Layer":
        if not isinstance(obj, dict):
            raise ManifestError(f"layer must be an object, got {type(obj).__name__}")
        try:
            digest = str(obj["digest"])
            parse_digest(digest)
            return cls(str(obj.get("mediaType", "")), "sha256:" + parse_digest(digest), int(obj.get("size", 0)),
                       obj.get("name") or None, obj.get("from") or None)
        except (KeyError, ValueError, TypeError) as e:
            raise ManifestError(f"bad layer {obj!r}: {e}") from e


@dataclass
class Manifest:
    """A model manifest: a config blob plus ordered layers."""

    config: Layer
    layers: list[Layer] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        """Serialised like Ollama (compact JSON); the model digest is the sha256 of these bytes."""
        obj = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": self.config.to_json(),
            "layers": [layer.to_json() for layer in self.layers],
        }
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Manifest":
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise ManifestError(f"manifest is not JSON: {e}") from e
        if not isinstance(obj, dict) or "config" not in obj:
            raise ManifestError("manifest lacks a config")
        layers = obj.get("layers") or []
        if not isinstance(layers, list):
            raise ManifestError("manifest layers must be a list")
        return cls(Layer.from_json(obj["config"]), [Layer.from_json(x) for x in layers])

    @property
    def size(self) -> int:
        """Sum of the config and layer sizes (Ollama's model size)."""
        return self.config.size + sum(layer.size for layer in self.layers)

    def digests(self) -> set[str]:
        return {self.config.digest, *(layer.digest for layer in self.layers)}

    def find(self, media_type: str) -> list[Layer]:
        return [layer for layer in self.layers if layer.media_type == media_type]

    def first(self, *media_types: str) -> Layer | None:
        for layer in self.layers:
            if layer.media_type in media_types:
                return layer
        return None


@dataclass
class ModelConfig:
    """The config blob (Ollama's model.ConfigV2); unknown keys are kept so a round trip loses nothing."""

    model_format: str = ""
    model_family: str = ""
    model_families: list[str] = field(default_factory=list)
    model_type: str = ""  # parameter size, e.g. "8.0B"
    file_type: str = ""  # quantization level, e.g. "Q8_0"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        obj = dict(self.extra)
        obj.update(model_format=self.model_format, model_family=self.model_family,
                   model_families=list(self.model_families), model_type=self.model_type, file_type=self.file_type)
        obj.setdefault("architecture", "amd64")
        obj.setdefault("os", "linux")
        return json.dumps(obj, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "ModelConfig":
        try:
            obj = json.loads(data) if data else {}
        except (ValueError, UnicodeDecodeError):
            obj = {}
        if not isinstance(obj, dict):
            obj = {}
        known = {"model_format", "model_family", "model_families", "model_type", "file_type"}
        return cls(
            model_format=str(obj.get("model_format") or ""),
            model_family=str(obj.get("model_family") or ""),
            model_families=[str(x) for x in (obj.get("model_families") or [])],
            model_type=str(obj.get("model_type") or ""),
            file_type=str(obj.get("file_type") or ""),
            extra={k: v for k, v in obj.items() if k not in known},
        )
