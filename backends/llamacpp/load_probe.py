"""Load a GGUF in a child process before the daemon loads it: llama.cpp aborts on some bad headers.

llama.cpp checks many header values with GGML_ASSERT, which calls abort(): a file with a crafted layer count,
head layout or tensor shape would take the whole daemon down, and since the model stays in the store, every
later request would again. The generic keys are checked in Python first (`common.gguf_checks`); this catches
the rest (architecture-specific asserts in `load_hparams`, tensor creation and the graph built when a context
is made) by doing exactly that in a child: load with mmap (no weights read), make a small generation context
and an embeddings one. A child killed by a signal means the file is refused with llama.cpp's own assert line.
A verdict is kept per file content (blobs are named by digest) for the life of the process.
"""
from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading

from ..base import ModelLoadError

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 300  # a cold mmap of a big file on a slow disk; the check is skipped (with a warning) past it
_OK, _LOAD_FAILED, _CONTEXT_FAILED = 0, 3, 4
_BLOB = re.compile(r"sha256-[0-9a-f]{64}")
_verdicts: dict[tuple, str | None] = {}  # file identity -> None (loads) or the refusal message
_lock = threading.Lock()
_ASSERT = re.compile(r"GGML_ASSERT\((.*)\) failed|error: (.*)")


def _identity(path: str) -> tuple:
    """A store blob is its digest; any other file is its real path, size and mtime."""
    name = os.path.basename(path)
    if _BLOB.fullmatch(name):
        return ("blob", name)
    st = os.stat(path)
    return ("file", os.path.realpath(path), st.st_size, st.st_mtime_ns)


def check_loads(path: str) -> None:
    """ModelLoadError when llama.cpp would abort loading `path`; returns when it loads (or cannot be probed)."""
    try:
        key = _identity(path)
    except OSError:
        return  # the real load reports a missing file in its own words
    with _lock:
        if key in _verdicts:
            verdict = _verdicts[key]
        else:
            verdict = _verdicts[key] = _probe(path)
    if verdict is not None:
        raise ModelLoadError(f"{path}: {verdict}")


def _probe(path: str) -> str | None:
    env = {**os.environ, "GGML_NO_BACKTRACE": "1",  # an abort prints its assert line, not a gdb backtrace
           "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""}  # the probe never touches a GPU
    try:
        proc = subprocess.run([sys.executable, "-m", __name__, path], capture_output=True, text=True,
                              errors="replace", timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        log.warning("llama.cpp load probe of %s took over %ds; loading without it", path, PROBE_TIMEOUT_S)
        return None
    except OSError as e:
        log.warning("llama.cpp load probe could not run (%s); loading without it", e)
        return None
    if proc.returncode in (_OK, _LOAD_FAILED, _CONTEXT_FAILED):
        return None  # it loads, or llama.cpp refuses it cleanly: the real load then says why
    if proc.returncode > 0:  # the probe itself failed (an import error, say): that says nothing about the file
        log.warning("llama.cpp load probe of %s exited with status %d (%s); loading without it", path,
                    proc.returncode, _reason(proc.stderr) or proc.stderr.strip()[-200:])
        return None
    reason = _reason(proc.stderr)
    try:
        sig = signal.Signals(-proc.returncode).name
    except ValueError:
        sig = f"signal {-proc.returncode}"
    what = f"llama.cpp crashes loading this model ({sig})"
    log.warning("refusing %s: %s%s", path, what, f": {reason}" if reason else "")
    return what + (f": {reason}" if reason else "")


def _reason(stderr: str) -> str:
    """The assert expression (or last error line) llama.cpp printed, without its source path."""
    for line in reversed(stderr.splitlines()):
        m = _ASSERT.search(line)
        if m:
            return (m.group(1) or m.group(2) or "").strip()[:300]
    return ""


def _main(path: str) -> int:
    """Child: load `path` as the runner does (mmap, CPU), then make a generation and an embeddings context."""
    import ctypes

    from .lib import L

    @L.llama_log_callback
    def quiet(level: int, text: bytes, user: ctypes.c_void_p) -> None:
        if level == 4 and text:  # errors: the parent quotes the last one
            sys.stderr.write("error: " + text.decode("utf-8", "replace"))

    L.llama_log_set(quiet, ctypes.c_void_p(0))
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mode = L.LLAMA_LOAD_MODE_MMAP
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        return _LOAD_FAILED
    for embeddings in (False, True):
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
        cp.n_seq_max, cp.n_threads, cp.n_threads_batch = 1, 1, 1
        if embeddings:
            cp.embeddings, cp.pooling_type = True, L.LLAMA_POOLING_TYPE_NONE
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            return _CONTEXT_FAILED
        L.llama_free(ctx)
    L.llama_model_free(model)
    return _OK


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1]))
