"""llama.cpp's RPC backend (a build with -DGGML_RPC=ON): a server process lends its device to a client, where it
shows up as a GPU-type device (`RPC0[host:port]`) that layers and KV are offloaded to through the same device,
buffer and scheduler code as CUDA or Metal. Used to prove the offload path on a machine without a GPU
(tests/test_llamacpp_rpc.py, packaging/rpc_check.sh).

    python -m evenflow.backends.llamacpp.rpc serve 127.0.0.1:50052     # lends this process's CPU device
"""
from __future__ import annotations

import ctypes
import os
import sys

from .devices import Device, lib_dir, list_devices

_rpc: ctypes.CDLL | None = None
RPC_ENV = "EVENFLOW_LLAMACPP_RPC"  # host:port[,host:port]: RPC servers whose devices models offload to (llama.cpp's --rpc)
_added: set[str] = set()


def available() -> bool:
    """Whether the loaded llama.cpp has the RPC backend (libggml-rpc beside libllama)."""
    return any(os.path.exists(os.path.join(lib_dir(), n)) for n in ("libggml-rpc.so", "libggml-rpc.dylib"))


def _lib() -> ctypes.CDLL:
    global _rpc
    if _rpc is None:
        if not available():
            raise RuntimeError(f"this llama.cpp build has no RPC backend (no libggml-rpc in {lib_dir()}); "
                               "build one with -DGGML_RPC=ON (packaging/rpc_check.sh)")
        name = next(n for n in ("libggml-rpc.so", "libggml-rpc.dylib") if os.path.exists(os.path.join(lib_dir(), n)))
        lib = ctypes.CDLL(os.path.join(lib_dir(), name))
        vp = ctypes.c_void_p
        lib.ggml_backend_rpc_add_server.argtypes, lib.ggml_backend_rpc_add_server.restype = [ctypes.c_char_p], vp
        lib.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                                      ctypes.c_size_t, ctypes.POINTER(vp)]
        lib.ggml_backend_rpc_start_server.restype = None
        _rpc = lib
    return _rpc


def add_server(endpoint: str) -> list[Device]:
    """Register the RPC server at `endpoint` (host:port) with ggml; returns its devices (offloadable, type GPU)."""
    from .devices import _ggml
    from .native import ensure_backend

    ensure_backend()
    before = {d.handle for d in list_devices()}
    reg = _lib().ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise RuntimeError(f"could not reach an RPC server at {endpoint}")
    g = _ggml()
    g.ggml_backend_register.argtypes, g.ggml_backend_register.restype = [ctypes.c_void_p], None
    g.ggml_backend_register(reg)
    return [d for d in list_devices() if d.handle not in before]


def add_servers_from_env() -> None:
    """Register the servers EVENFLOW_LLAMACPP_RPC names, once per process (before devices are listed)."""
    import logging

    for endpoint in filter(None, (e.strip() for e in os.environ.get(RPC_ENV, "").split(","))):
        if endpoint in _added:
            continue
        _added.add(endpoint)
        devices = add_server(endpoint)
        logging.getLogger(__name__).info("llama.cpp RPC server %s: %s", endpoint,
                                         ", ".join(f"{d.name} ({d.description})" for d in devices))


def serve(endpoint: str, threads: int | None = None) -> None:
    """Serve this process's CPU device at `endpoint` until killed (blocks)."""
    from .native import ensure_backend, physical_cores

    ensure_backend()
    cpu = [d for d in list_devices() if d.kind == "cpu"]
    if not cpu:
        raise RuntimeError("llama.cpp lists no CPU device")
    devs = (ctypes.c_void_p * 1)(cpu[0].handle)
    _lib().ggml_backend_rpc_start_server(endpoint.encode(), None, threads or physical_cores(), 1, devs)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        sys.exit("usage: python -m evenflow.backends.llamacpp.rpc serve HOST:PORT")
    print(f"rpc server on {sys.argv[2]}", flush=True)
    serve(sys.argv[2])
