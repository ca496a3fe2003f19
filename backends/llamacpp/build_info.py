"""Which llama-cpp-python build is installed, read from the libraries in its package folder, without loading it.

A build's GPU backends are shared libraries next to libllama (libggml-cuda, libggml-metal, ...), and libmtmd is
there when it was built with LLAVA_BUILD (the default, needed for vision). pip's wheel cache does not key on
CMAKE_ARGS, so this is how packaging/dev.sh tells a cached CPU wheel from the CUDA build it wants. Standard
library only: dev.sh runs this file as a script (`python3 backends/llamacpp/build_info.py`) before evenflow is
installed; it prints the variant, e.g. `cuda+mtmd`, or `none`.
"""
from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass

GPU_BACKENDS = ("cuda", "metal", "vulkan", "hip", "sycl", "opencl", "musa")  # ggml-<name> libraries
_LIB = re.compile(r"^(?:lib)?(ggml-[a-z0-9]+|mtmd)\.(?:so|dylib|dll)(?:\.|$)")


@dataclass(frozen=True)
class BuildInfo:
    installed: bool
    version: str
    lib_dir: str
    backends: tuple[str, ...]  # ggml backends found: cpu, cuda, metal, rpc, ...
    mtmd: bool

    @property
    def gpu(self) -> str | None:
        """The GPU backend the build offloads to, if any."""
        return next((b for b in GPU_BACKENDS if b in self.backends), None)

    @property
    def variant(self) -> str:
        """cpu | cuda | metal | ... with +mtmd when libmtmd is there, +rpc for the RPC backend; none if absent."""
        if not self.installed:
            return "none"
        return (self.gpu or "cpu") + ("+rpc" if "rpc" in self.backends else "") + ("+mtmd" if self.mtmd else "")


def read(package_dir: str | None = None) -> BuildInfo:
    """The build in `package_dir` (a `llama_cpp` folder), else the one Python would import (with its libraries
    from LLAMA_CPP_LIB_PATH when that is set, as llama_cpp does)."""
    explicit = package_dir
    if package_dir is None:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.origin:
            return BuildInfo(False, "", "", (), False)
        package_dir = os.path.dirname(spec.origin)
    lib_dir = os.path.join(package_dir, "lib")
    if explicit is None and os.environ.get("LLAMA_CPP_LIB_PATH"):  # llama_cpp loads its libraries from there then
        lib_dir = os.environ["LLAMA_CPP_LIB_PATH"]
    names = os.listdir(lib_dir) if os.path.isdir(lib_dir) else os.listdir(package_dir)
    found = {m.group(1) for m in map(_LIB.match, names) if m}
    backends = tuple(sorted(n[len("ggml-"):] for n in found if n.startswith("ggml-") and n != "ggml-base"))
    if sys.platform == "darwin" and "metal" not in backends and _metal_embedded(lib_dir):
        backends = tuple(sorted(backends + ("metal",)))
    return BuildInfo(True, _version(package_dir), lib_dir, backends, "mtmd" in found)


def _metal_embedded(lib_dir: str) -> bool:
    """A macOS build may link Metal into libggml itself (no libggml-metal): look for its symbol."""
    for name in ("libggml.dylib", "libggml-base.dylib"):
        try:
            with open(os.path.join(lib_dir, name), "rb") as f:
                if b"ggml_backend_metal_reg" in f.read():
                    return True
        except OSError:
            continue
    return False


def _version(package_dir: str) -> str:
    try:
        with open(os.path.join(package_dir, "__init__.py")) as f:
            m = re.search(r"__version__\s*=\s*[\"']([^\"']+)", f.read())
        return m.group(1) if m else ""
    except OSError:
        return ""


if __name__ == "__main__":
    dirs = [a for a in sys.argv[1:] if not a.startswith("--")]
    info = read(dirs[0] if dirs else None)
    print(info.version if "--version" in sys.argv else info.variant)
