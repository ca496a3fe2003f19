#!/usr/bin/env bash
# The GPU-offload path proven without a GPU (issue 32): builds llama-cpp-python with llama.cpp's RPC backend in a
# side folder (once, ~3.5 min on 2 cores; the installed llama-cpp-python is left alone), then runs
# tests/test_llamacpp_rpc.py: a loopback RPC server lends its CPU device, every layer and the KV go there, and the
# greedy tokens (mixed batches, every chunk size) must equal the CPU build's. Not part of CI (see README).
#   EVENFLOW_RPC_LLAMA_CPP   the side folder (default ~/.cache/evenflow/lcp-rpc)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
SIDE="${EVENFLOW_RPC_LLAMA_CPP:-${XDG_CACHE_HOME:-$HOME/.cache}/evenflow/lcp-rpc}"
ver="$("$PY" backends/llamacpp/build_info.py --version)"
if [ ! -e "$SIDE/llama_cpp/lib/libggml-rpc.so" ]; then
  echo "rpc_check: building llama-cpp-python==$ver with -DGGML_RPC=ON into $SIDE (~3.5 min on 2 cores)" >&2
  # --no-cache-dir: pip's wheel cache does not key on CMAKE_ARGS, a cached CPU wheel would come back
  CMAKE_ARGS="-DGGML_RPC=ON -DLLAVA_BUILD=OFF" "$PY" -m pip install --no-cache-dir --no-deps --target "$SIDE" \
    "llama-cpp-python==$ver"
fi
echo "rpc_check: $("$PY" backends/llamacpp/build_info.py "$SIDE/llama_cpp") build in $SIDE" >&2
EVENFLOW_RPC_LLAMA_CPP="$SIDE" exec "$PY" -m pytest -q tests/test_llamacpp_rpc.py "$@"
