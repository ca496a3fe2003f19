#!/usr/bin/env bash
# One entry point for a fresh machine: installs evenflow (editable) and its dependencies, then
#   serve [flags]   starts the daemon on 127.0.0.1:11434 (creates the synthetic `demo` model if the store is empty)
#   test [args]     runs the test suite
#   bench [args]    runs `evenflow bench`
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
what="${1:-serve}"; shift || true

install() {
  # torch 2.13.0 is the CPU build on this project's machines; keep a torch the user already has (e.g. CUDA).
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
  # llama-cpp-python compiles llama.cpp once (~4 min on 2 cores); pip caches the wheel afterwards.
  # Not -q: pip's lines (and its spinner while llama.cpp builds) are the only sign of progress.
  echo "dev.sh: installing evenflow$1 into $("$PY" -c 'import sys; print(sys.prefix)') (first run: ~4 min)" >&2
  CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" "$PY" -m pip install --progress-bar on -e ".$1"
}

case "$what" in
  serve) install "" ; exec "$PY" -m evenflow.clients.cli serve "$@" ;;
  test)  install "[dev]"
         # ollama-js (pinned in tests/js/package.json) for the JavaScript client test; skipped there without npm
         if command -v npm >/dev/null; then npm install --prefix tests/js --no-audit --no-fund --loglevel=error; fi
         exec "$PY" -m pytest -q "$@" ;;
  bench) install "[dev]" ; exec "$PY" -m evenflow.clients.cli bench "$@" ;;
  *) echo "usage: packaging/dev.sh serve|test|bench [args]" >&2; exit 2 ;;
esac
