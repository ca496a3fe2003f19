"""The devices llama.cpp's ggml sees (CPU, CUDA, Metal, Vulkan, RPC ...) and their memory, via ctypes.

llama-cpp-python 0.3.36 binds none of ggml's device registry (`ggml_backend_dev_*`), so this loads the
`libggml` / `libggml-base` it ships (the same copies libllama uses) and calls them directly.
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

from .lib import L

log = logging.getLogger(__name__)

# enum ggml_backend_dev_type (ggml-backend.h)
DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
_lib: ctypes.CDLL | None = None


@dataclass(frozen=True)
class Device:
    index: int  # in ggml's registry (llama.cpp's default device list is its GPUs, in this order)
    name: str  # CUDA0, Metal, Vulkan0, RPC0[host:port], CPU ...
    description: str
    kind: str  # cpu | gpu | igpu | accel | meta
    free: int  # bytes
    total: int
    handle: int  # ggml_backend_dev_t

    @property
    def offloads(self) -> bool:
        """A device llama.cpp offloads layers to (GPUs, integrated GPUs, RPC servers)."""
        return self.kind in ("gpu", "igpu")


def lib_dir() -> str:
    """The folder of the shared libraries llama-cpp-python loaded."""
    return os.path.dirname(L._lib._name) if getattr(L._lib, "_name", None) else ""


def _ggml() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        names = ("libggml.so", "libggml.dylib", "ggml.dll")
        path = next((os.path.join(lib_dir(), n) for n in names if os.path.exists(os.path.join(lib_dir(), n))), None)
        if path is None:
            raise RuntimeError(f"llama-cpp-python's libggml not found in {lib_dir()!r}")
        lib = ctypes.CDLL(path)
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        lib.ggml_backend_dev_count.restype = sz
        lib.ggml_backend_dev_get.argtypes, lib.ggml_backend_dev_get.restype = [sz], vp
        lib.ggml_backend_dev_name.argtypes, lib.ggml_backend_dev_name.restype = [vp], ctypes.c_char_p
        lib.ggml_backend_dev_description.argtypes, lib.ggml_backend_dev_description.restype = [vp], ctypes.c_char_p
        lib.ggml_backend_dev_type.argtypes, lib.ggml_backend_dev_type.restype = [vp], ctypes.c_int
        lib.ggml_backend_dev_memory.argtypes = [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)]
        lib.ggml_backend_dev_memory.restype = None
        _lib = lib
    return _lib


def list_devices() -> list[Device]:
    """Every device in ggml's registry now, with its free and total memory."""
    from .native import ensure_backend

    ensure_backend()  # loads the dynamic backends of a GGML_BACKEND_DL build
    lib = _ggml()
    out = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(i, (lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                          (lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                          DEVICE_TYPES.get(int(lib.ggml_backend_dev_type(dev)), "unknown"),
                          int(free.value), int(total.value), int(dev)))
    return out


def offload_devices() -> list[Device]:
    """The devices llama.cpp offloads to by default (its GPUs, in registry order: main_gpu indexes these)."""
    return [d for d in list_devices() if d.offloads]


def supports_gpu_offload() -> bool:
    return bool(L.llama_supports_gpu_offload())


def device_array(devices: list[Device]) -> ctypes.Array:
    """A NULL-terminated ggml_backend_dev_t array for llama_model_params.devices (keep it alive while loading)."""
    arr = (ctypes.c_void_p * (len(devices) + 1))(*[d.handle for d in devices], None)
    return arr
