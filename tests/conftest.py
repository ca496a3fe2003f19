"""Shared fixtures: synthetic models (cached per test session) and the optional shared fixtures folder."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

_CREATED_CACHE: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    # CI starts clean: models and tokenizers are built once per session unless the caller chose a cache.
    global _CREATED_CACHE
    if not os.environ.get("EVENFLOW_SYNTHETIC_CACHE"):
        _CREATED_CACHE = tempfile.mkdtemp(prefix="evenflow-synthetic-")
        os.environ["EVENFLOW_SYNTHETIC_CACHE"] = _CREATED_CACHE
    # Daemons started by tests save KV prefixes under the session's temporary folder, never the user's cache.
    if not os.environ.get("EVENFLOW_KV_CACHE_DIR"):
        os.environ["EVENFLOW_KV_CACHE_DIR"] = os.path.join(_CREATED_CACHE or tempfile.gettempdir(), "kv-cache")
    # A developer's own API key file (`evenflow key new`) must not turn auth on in every test daemon.
    if not os.environ.get("EVENFLOW_API_KEY_FILE"):
        os.environ["EVENFLOW_API_KEY_FILE"] = os.path.join(tempfile.gettempdir(), f"evenflow-no-key-{os.getpid()}")
    _patient_httpx()


def _patient_httpx() -> None:
    """httpx's calls and sync clients wait 5 s by default: on a loaded 2-core CI machine a model load or a first
    generation can take longer, so a test's plain `httpx.post(...)` would fail on a margin of time. A test that means
    a timeout passes its own."""
    import httpx

    patient = httpx.Timeout(300.0, connect=30.0)
    for name in ("request", "stream", "get", "options", "head", "post", "put", "patch", "delete"):
        fn = getattr(httpx, name)
        getattr(fn, "__wrapped__", fn).__kwdefaults__["timeout"] = patient  # stream is a contextmanager
    httpx.Client.__init__.__kwdefaults__["timeout"] = patient


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CREATED_CACHE is not None:
        shutil.rmtree(_CREATED_CACHE, ignore_errors=True)


@pytest.fixture(scope="session")
def synthetic_model() -> Callable[..., dict[str, Path]]:
    """Factory: synthetic_model(preset="tiny", arch="llama", formats=("hf","gguf"), gguf_dtype="f32", **overrides)."""
    from evenflow.backends.synthetic import cached_model, make_spec

    def make(preset: str = "tiny", arch: str = "llama", formats: tuple[str, ...] = ("hf", "gguf"),
             gguf_dtype: str = "f32", **overrides: Any) -> dict[str, Path]:
        return cached_model(make_spec(preset, architecture=arch, **overrides), formats, gguf_dtype)

    return make


def shared_fixtures_path() -> Path:
    """EVENFLOW_FIXTURES, else ../shared/fixtures next to the repository."""
    env = os.environ.get("EVENFLOW_FIXTURES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """The shared fixtures folder (real vocabs, chat templates); skips where a clone has none."""
    path = shared_fixtures_path()
    if not path.is_dir():
        pytest.skip(f"shared fixtures not found at {path} (set EVENFLOW_FIXTURES to the folder)")
    return path
