"""Model names and blob digests, parsed and validated by Ollama's rules (types/model/name.go).

A name is `[host/][namespace/]model[:tag]`; every part is checked against a strict character set
so that no user-supplied name can ever form a path outside the store.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

# (pattern, max length) per part; the first character must be [A-Za-z0-9_] for every part.
_PART_RULES: dict[str, tuple[re.Pattern[str], int]] = {
    # Ollama allows 350 for a host, but it is a directory name on disk: NAME_MAX is 255 bytes (ASCII here)
    "host": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*"), 255),
    "namespace": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*"), 80),
    "model": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 80),
    "tag": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"), 80),
}
_DIGEST_RE = re.compile(r"sha256[:-]([0-9a-fA-F]{64})")


class InvalidName(ValueError):
    """A model name that breaks Ollama's naming rules (HTTP 400 upstream)."""


class InvalidDigest(ValueError):
    """A blob digest that is not `sha256:<64 hex>` (HTTP 400 upstream)."""


@dataclass(frozen=True)
class ModelName:
    """A fully qualified model name: host/namespace/model:tag."""

    host: str
    namespace: str
    model: str
    tag: str

    def display(self) -> str:
        """Ollama's shortest form: default host and namespace dropped, the tag always shown."""
        if self.host.lower() != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace.lower() != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def full(self) -> str:
        """The fully qualified form, e.g. `registry.ollama.ai/library/demo:latest`."""
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"

    @property
    def parts(self) -> tuple[str, str, str, str]:
        """The four path components of the manifest under `manifests/`."""
        return (_host_dir(self.host), self.namespace, self.model, self.tag)

    def key(self) -> tuple[str, str, str, str]:
        """Case-insensitive identity (Ollama compares names with EqualFold)."""
        return tuple(p.lower() for p in self.parts)  # type: ignore[return-value]

    def __str__(self) -> str:
        return self.display()


def _host_dir(host: str) -> str:
    # Ollama keeps the port in the directory name ("host:5000"); the scheme never reaches disk.
    return host


def _check_part(kind: str, value: str, whole: str) -> str:
    pattern, max_len = _PART_RULES[kind]
    if not value:
        raise InvalidName(f"invalid model name {whole!r}: empty {kind}")
    if len(value) > max_len:
        raise InvalidName(f"invalid model name {whole!r}: {kind} longer than {max_len} characters")
    if not pattern.fullmatch(value):
        allowed = {"host": "A-Z a-z 0-9 _ . : -", "namespace": "A-Z a-z 0-9 _ -"}.get(kind, "A-Z a-z 0-9 _ . -")
        raise InvalidName(
            f"invalid model name {whole!r}: {kind} {value!r} must start with a letter, digit or _ "
            f"and use only {allowed}"
        )
    if value in (".", "..") or ".." in value.split("/"):
        raise InvalidName(f"invalid model name {whole!r}: {kind} {value!r} is not allowed")
    return value


def parse_name(text: str) -> ModelName:
    """Parse and validate `[scheme://][host/][namespace/]model[:tag]`, filling Ollama's defaults."""
    if not isinstance(text, str):
        raise InvalidName(f"invalid model name {text!r}: expected a string")
    whole = text
    s = text.strip()
    if not s:
        raise InvalidName("invalid model name '': the name is empty")
    if "\\" in s or "\x00" in s or s.startswith("/"):
        raise InvalidName(f"invalid model name {whole!r}: absolute paths and backslashes are not allowed")
    scheme_end = s.find("://")
    if scheme_end != -1:
        scheme = s[:scheme_end]
        if scheme not in ("http", "https"):
            raise InvalidName(f"invalid model name {whole!r}: scheme must be http or https")
        s = s[scheme_end + 3 :]
    tag = DEFAULT_TAG
    colon, slash = s.rfind(":"), s.rfind("/")
    if colon > slash:  # a ':' before the last '/' belongs to a host:port
        s, tag = s[:colon], s[colon + 1 :]
        _check_part("tag", tag, whole)
    pieces = s.split("/")
    if len(pieces) > 3:
        raise InvalidName(f"invalid model name {whole!r}: at most host/namespace/model:tag")
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(pieces) == 3:
        host, namespace, model = pieces
    elif len(pieces) == 2:
        namespace, model = pieces
    else:
        (model,) = pieces
    _check_part("host", host, whole)
    _check_part("namespace", namespace, whole)
    _check_part("model", model, whole)
    return ModelName(host, namespace, model, tag)


def name_scheme(text: str) -> str | None:
    """The scheme a name spells out (`http://host/ns/model`), lower-cased; None when it names none."""
    s = text.strip() if isinstance(text, str) else ""
    head, sep, _ = s.partition("://")
    return head.lower() if sep and head.lower() in ("http", "https") else None


def parse_digest(text: str) -> str:
    """`sha256:<hex>` or `sha256-<hex>` -> lower-case 64-hex string; anything else raises InvalidDigest."""
    if not isinstance(text, str) or not _DIGEST_RE.fullmatch(text):
        raise InvalidDigest(f"invalid digest format {text!r}: expected sha256:<64 hex digits>")
    return text[7:].lower()


def format_digest(hex_digest: str) -> str:
    """64-hex -> `sha256:<hex>` (the form used in manifests and the API)."""
    return f"sha256:{parse_digest('sha256:' + hex_digest)}"
