#!/usr/bin/env bash
# One entry point for a fresh machine: installs evenflow (editable) and its dependencies, then
#   serve [flags]   starts the daemon on 127.0.0.1:11434 (creates the synthetic `demo` model if the store is empty)
#   test [args]     runs the test suite
#   bench [args]    runs `evenflow bench`
#   llama           only (re)builds llama-cpp-python for this machine and says which variant it is
#   llama-plan      prints what `llama` would do ("keep cuda+mtmd", "build cuda+mtmd -DGGML_CUDA=on")
# llama-cpp-python is built for this machine: CUDA when a CUDA toolkit is present (nvcc on PATH or in
# /usr/local/cuda) and an NVIDIA driver too, Metal on macOS (llama.cpp's default there), the CPU otherwise; always with libmtmd (vision).
# EVENFLOW_LLAMA_VARIANT=cpu|cuda|metal overrides the choice; extra CMAKE_ARGS are added to the build's.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
what="${1:-serve}"; shift || true
LLAMA_SPEC="llama-cpp-python>=0.3.16"
case "${EVENFLOW_LLAMA_VARIANT:-}" in
  ""|cpu|cuda|metal) ;;
  *) echo "dev.sh: EVENFLOW_LLAMA_VARIANT=$EVENFLOW_LLAMA_VARIANT: expected cpu, cuda or metal" >&2; exit 2 ;;
esac

wanted_variant() {
  if [ -n "${EVENFLOW_LLAMA_VARIANT:-}" ]; then echo "$EVENFLOW_LLAMA_VARIANT"; return; fi
  if [ "$(uname -s)" = Darwin ]; then echo metal; return; fi
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    # a toolkit without an NVIDIA driver (a CI image, a build box) gets the CPU build: a CUDA libggml would not
    # even load there (it links libcuda), and it takes far longer to compile
    if nvidia_gpu; then echo cuda; return; fi
    echo "dev.sh: a CUDA toolkit but no NVIDIA GPU/driver here: building llama.cpp for the CPU" \
         "(EVENFLOW_LLAMA_VARIANT=cuda forces CUDA)" >&2
  fi
  echo cpu
}

nvidia_gpu() { [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1; }
want_variant() { echo "$WANT"; }  # wanted_variant's answer, decided (and explained) once, below

cmake_args() {  # $1: cpu | cuda | metal
  case "$1" in
    cuda)  echo "-DGGML_CUDA=on ${CMAKE_ARGS:-}" ;;
    metal) echo "-DGGML_METAL=on ${CMAKE_ARGS:-}" ;;
    *)     echo "${CMAKE_ARGS:-}" ;;
  esac
}

installed_variant() { "$PY" backends/llamacpp/build_info.py 2>/dev/null || echo none; }

llama_plan() {  # "keep <installed>" or "build <wanted>+mtmd <cmake args>"
  local want have args
  want="$(want_variant)"; have="$(installed_variant)"
  args="$(echo $(cmake_args "$want"))"  # word splitting trims the spaces
  if [ "${have%%+*}" = "$want" ] && [[ "$have" == *+mtmd ]]; then echo "keep $have"
  else echo "build $want+mtmd${args:+ $args}"; fi
}

ensure_llama() {
  # pip's wheel cache does not key on CMAKE_ARGS: a cached wheel of another variant (a CPU one built with
  # LLAVA_BUILD=OFF, say) would be reused silently. So: compare the installed build with the wanted one, and
  # when they differ build the wanted one without pip's cache, keeping the wheel under a name of ours that says
  # its variant (the next run installs it in seconds).
  local want have ver args cache wheel
  want="$(want_variant)"; args="$(cmake_args "$want")"
  if [ "$want" = cuda ] && ! command -v nvcc >/dev/null 2>&1; then export PATH="/usr/local/cuda/bin:$PATH"; fi
  have="$(installed_variant)"
  if [ "$(llama_plan | cut -d' ' -f1)" = keep ]; then
    echo "dev.sh: llama.cpp build: $have (llama-cpp-python $("$PY" backends/llamacpp/build_info.py --version))" >&2
    return
  fi
  ver="$("$PY" backends/llamacpp/build_info.py --version 2>/dev/null || true)"
  spec="$LLAMA_SPEC"; [ -n "$ver" ] && spec="llama-cpp-python==$ver"
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/evenflow/llama-wheels/$want-mtmd-$(echo "$args" | cksum | cut -d' ' -f1)"
  wheel="$(ls "$cache"/llama_cpp_python-"${ver:-*}"-*.whl 2>/dev/null | tail -1 || true)"
  if [ -z "$wheel" ]; then
    echo "dev.sh: llama-cpp-python is '$have'; building '$want+mtmd' ($spec, CMAKE_ARGS='$args'; ~4 min on" \
         "2 CPU cores, longer with CUDA)" >&2
    mkdir -p "$cache"
    CMAKE_ARGS="$args" "$PY" -m pip wheel --no-cache-dir --no-deps -w "$cache" "$spec"
    wheel="$(ls "$cache"/llama_cpp_python-*.whl | tail -1)"
  fi
  "$PY" -m pip install -q --no-cache-dir --force-reinstall --no-deps "$wheel"
  have="$(installed_variant)"
  echo "dev.sh: llama.cpp build: $have (from $wheel)" >&2
  if [ "${have%%+*}" != "$want" ] || [[ "$have" != *+mtmd ]]; then
    echo "dev.sh: the build is '$have', not '$want+mtmd': see the build log above" >&2; exit 1
  fi
}

install() {
  # torch 2.13.0 is the CPU build on this project's machines; keep a torch the user already has (e.g. CUDA).
  "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
  # llama-cpp-python compiles llama.cpp once (~4 min on 2 cores); the wheel is kept afterwards.
  # Not -q: pip's lines (and its spinner while llama.cpp builds) are the only sign of progress.
  echo "dev.sh: installing evenflow$1 into $("$PY" -c 'import sys; print(sys.prefix)') (first run: ~4 min)" >&2
  CMAKE_ARGS="$(cmake_args "$(want_variant)")" "$PY" -m pip install --progress-bar on -e ".$1"
  ensure_llama
}

WANT="$(wanted_variant)"
case "$what" in
  serve) install "" ; exec "$PY" -m evenflow.clients.cli serve "$@" ;;
  test)  install "[dev]"
         # ollama-js (pinned in tests/js/package.json) for the JavaScript client test; skipped there without npm
         if command -v npm >/dev/null; then npm install --prefix tests/js --no-audit --no-fund --loglevel=error; fi
         exec "$PY" -m pytest -q "$@" ;;
  bench) install "[dev]" ; exec "$PY" -m evenflow.clients.cli bench "$@" ;;
  llama) ensure_llama ;;
  llama-plan) llama_plan ;;  # what `llama` would do, without doing it
  *) echo "usage: packaging/dev.sh serve|test|bench|llama|llama-plan [args]" >&2; exit 2 ;;
esac
