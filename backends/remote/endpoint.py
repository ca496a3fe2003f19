"""A remote model's address: `FROM openai+http://host:port/v1/models/NAME` plus its PARAMETER settings.

Stored in the manifest's config blob (`remote`); the API key itself never is, only the name of the
environment variable that holds it.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("openai+http://", "openai+https://")
FROM_SHAPE = "openai+http://HOST:PORT/v1/models/NAME (or openai+https://...)"
DEFAULT_TIMEOUT_S = 300.0  # upstream silence (before the first token or between two) that becomes a 504
DEFAULT_CONNECT_TIMEOUT_S = 10.0
# PARAMETER keys that configure the connection rather than sampling, with their meaning for error messages.
SETTING_KEYS = {"api_key_env": "an environment variable name", "timeout": "seconds or a duration such as 90s, 5m",
                "connect_timeout": "seconds or a duration such as 5s"}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class EndpointError(ValueError):
    """A FROM URL or a remote setting that cannot be used; the message says what is expected."""


def is_remote_from(value: str | None) -> bool:
    return isinstance(value, str) and value.lower().startswith(SCHEMES)


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise EndpointError(f"parameter {key!r} must be {SETTING_KEYS[key]}, got {value!r}")
    if isinstance(value, (int, float)):
        secs = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise EndpointError(f"parameter {key!r} must be {SETTING_KEYS[key]}, got {value!r}")
        secs = float(m.group(1)) * _UNIT[m.group(2)]
    if not math.isfinite(secs) or secs <= 0:
        raise EndpointError(f"parameter {key!r} must be a positive duration, got {value!r}")
    return secs


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where a remote model is served and how to reach it."""

    url: str  # the FROM line as written (minus trailing slashes)
    base_url: str  # e.g. http://gpu:8000/v1 — the OpenAI API root
    model: str  # the upstream model id, e.g. meta-llama/Llama-3.1-70B-Instruct
    api_key_env: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S

    @classmethod
    def parse(cls, from_: str, settings: dict[str, Any] | None = None) -> "RemoteEndpoint":
        """Validate a FROM URL and the remote PARAMETERs; EndpointError names what is wrong."""
        url = from_.strip().rstrip("/")
        if not is_remote_from(url):
            raise EndpointError(f"a remote model's FROM must look like {FROM_SHAPE}, got {from_!r}")
        plain = url.split("+", 1)[1]
        parts = urlsplit(plain)
        if parts.username or parts.password:
            raise EndpointError("the FROM URL must not carry credentials; put the key in an environment variable "
                                "and name it with PARAMETER api_key_env")
        if parts.query or parts.fragment or not parts.hostname:
            raise EndpointError(f"a remote model's FROM must look like {FROM_SHAPE}, got {from_!r}")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError:
            raise EndpointError(f"bad port in {from_!r}") from None
        head, sep, model = parts.path.partition("/models/")
        if not sep or not model.strip("/"):
            raise EndpointError(f"the FROM URL must name the model after /models/: {FROM_SHAPE}, got {from_!r}")
        s = dict(settings or {})
        unknown = set(s) - set(SETTING_KEYS)
        if unknown:
            raise EndpointError(f"unknown remote setting(s) {', '.join(sorted(unknown))}; allowed: "
                                f"{', '.join(SETTING_KEYS)}")
        env = s.get("api_key_env")
        if env is not None and (not isinstance(env, str) or not _ENV_NAME.match(env)):
            raise EndpointError(f"parameter 'api_key_env' must be an environment variable name such as "
                                f"CLUSTER_API_KEY (the key itself never goes in a Modelfile), got {env!r}")
        return cls(url=url, base_url=f"{parts.scheme}://{parts.netloc}{head}", model=model.strip("/"),
                   api_key_env=env or None,
                   timeout=_seconds("timeout", s["timeout"]) if "timeout" in s else DEFAULT_TIMEOUT_S,
                   connect_timeout=_seconds("connect_timeout", s["connect_timeout"]) if "connect_timeout" in s
                   else DEFAULT_CONNECT_TIMEOUT_S)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> "RemoteEndpoint":
        if not isinstance(obj, dict) or not isinstance(obj.get("url"), str):
            raise EndpointError(f"bad remote config {obj!r}")
        settings = {k: obj[k] for k in SETTING_KEYS if obj.get(k) is not None}
        return cls.parse(obj["url"], settings)

    def settings(self) -> dict[str, Any]:
        """The PARAMETER lines that recreate this endpoint (non-defaults only)."""
        out: dict[str, Any] = {}
        if self.api_key_env:
            out["api_key_env"] = self.api_key_env
        if self.timeout != DEFAULT_TIMEOUT_S:
            out["timeout"] = self.timeout
        if self.connect_timeout != DEFAULT_CONNECT_TIMEOUT_S:
            out["connect_timeout"] = self.connect_timeout
        return out
