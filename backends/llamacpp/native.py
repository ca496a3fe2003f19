"""Process-wide llama.cpp setup: backend init once, its log routed to Python logging, CPU core count."""
from __future__ import annotations

import collections
import ctypes
import logging
import os
import threading
from typing import Any

from .lib import L

log = logging.getLogger(__name__)
native_log = logging.getLogger("evenflow.backends.llamacpp.native")

_init_lock = threading.Lock()
_initialised = False
_log_callback = None  # keep the ctypes callback alive for the life of the process
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_GGML_ERROR, _GGML_WARN = 4, 3  # ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT


def ensure_backend() -> None:
    """Initialise llama.cpp's backends and silence its stderr (to DEBUG logging) exactly once."""
    global _initialised, _log_callback
    with _init_lock:
        if _initialised:
            return

        @L.llama_log_callback
        def _route(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            msg = text.decode("utf-8", errors="replace").rstrip("\n") if text else ""
            if level in (_GGML_ERROR, _GGML_WARN) and msg:
                _recent_errors.append(msg)  # quoted in ModelLoadError / RuntimeError messages
            if msg and native_log.isEnabledFor(logging.DEBUG):
                native_log.debug("%s", msg)

        _log_callback = _route
        L.llama_log_set(_log_callback, ctypes.c_void_p(0))
        L.llama_backend_init()
        _initialised = True


def log_callback() -> Any:
    """The ctypes callback routing llama.cpp's logs (None before ensure_backend): libmtmd's logs take it too."""
    return _log_callback


def take_recent_errors() -> str:
    """llama.cpp's latest warning/error lines (cleared), for an exception message."""
    text = " | ".join(_recent_errors)
    _recent_errors.clear()
    return text


def physical_cores() -> int:
    """Physical cores available to this process (hyperthread siblings counted once)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = list(range(os.cpu_count() or 1))
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{base}/physical_package_id") as f:
                pkg = f.read().strip()
            with open(f"{base}/core_id") as f:
                core = f.read().strip()
        except OSError:
            return max(1, len(cpus))
        cores.add((pkg, core))
    return max(1, len(cores))
