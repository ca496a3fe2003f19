"""Launch llama-server (in-process, from the `xllamacpp` wheel) on a GGUF for side-by-side `evenflow bench` runs.

    python docs/bench/llama_server.py MODEL.gguf --n-batch 2048 --n-ubatch 512 --slots 5 --port 8080
    evenflow bench stall --url http://127.0.0.1:8080 --protocol openai-completions --streams 4 -L 2048

llama-server mixes running decodes and pending prompt tokens in one batch of at most n_batch tokens, so
n_batch is its "token budget": its streams stall for about the time of one n_batch-token step.
The stall scenario needs slots >= streams + 1. The server listens on 127.0.0.1 only.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)


def make_params(gguf: str | Path, n_batch: int = 2048, n_ubatch: int = 512, slots: int = 4,
                ctx_per_slot: int = 4096, port: int = 0, threads: int | None = None,
                no_extra_bufts: bool = True, verbosity: int | None = None,
                speculative: list[Any] | None = None) -> Any:
    """xllamacpp.CommonParams for llama-server with the given batch sizes and parallel slots; `speculative`:
    `--spec-type` values (xllamacpp.common_speculative_type members) at llama-server's default sizes."""
    import xllamacpp

    if not Path(gguf).is_file():
        raise FileNotFoundError(f"GGUF not found: {gguf}")
    if not 1 <= n_ubatch <= n_batch:
        raise ValueError(f"need 1 <= n_ubatch <= n_batch, got n_ubatch={n_ubatch}, n_batch={n_batch}")
    if slots < 1 or ctx_per_slot < 16:
        raise ValueError(f"need slots >= 1 and ctx_per_slot >= 16, got {slots}, {ctx_per_slot}")
    p = xllamacpp.CommonParams()
    p.model.path = str(gguf)
    p.n_parallel = slots
    p.n_ctx = ctx_per_slot * slots  # explicit slots -> non-unified KV: each slot gets n_ctx / slots
    p.n_batch = n_batch
    p.n_ubatch = n_ubatch
    p.cont_batching = True
    n = threads or os.cpu_count() or 1
    p.cpuparams.n_threads = n
    p.cpuparams_batch.n_threads = n
    # Extra buffer types repack weights for AMX/AVX kernels; some VMs advertise AMX and fault on it (SIGILL).
    p.no_extra_bufts = no_extra_bufts
    p.warmup = False
    p.hostnames = ["127.0.0.1"]
    p.port = port  # 0: any free port; read it back from listening_address
    if verbosity is not None:
        p.verbosity = verbosity
    if speculative:
        p.speculative.types = list(speculative)
    return p


@contextlib.contextmanager
def llama_server(gguf: str | Path, **kwargs: Any) -> Iterator[str]:
    """Start llama-server in this process and yield its base URL; it stops when the context exits."""
    import xllamacpp

    server = xllamacpp.Server(make_params(gguf, **kwargs))
    try:
        url = server.listening_address
        log.info("llama-server listening on %s", url)
        yield url.rstrip("/")
    finally:
        del server  # the destructor stops the HTTP server and the main loop
        gc.collect()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--n-batch", "-b", type=int, default=2048)
    ap.add_argument("--n-ubatch", "-ub", type=int, default=512)
    ap.add_argument("--slots", "-np", type=int, default=5)
    ap.add_argument("--ctx-per-slot", type=int, default=4096)
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--threads", "-t", type=int, default=None)
    ap.add_argument("--extra-bufts", action="store_true", help="allow weight repacking (AMX etc.)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    with llama_server(a.gguf, n_batch=a.n_batch, n_ubatch=a.n_ubatch, slots=a.slots, ctx_per_slot=a.ctx_per_slot,
                      port=a.port, threads=a.threads, no_extra_bufts=not a.extra_bufts) as url:
        print(f"llama-server at {url} (n_batch={a.n_batch}, n_ubatch={a.n_ubatch}, slots={a.slots}); Ctrl-C stops")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
