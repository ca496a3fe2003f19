"""llama.cpp backend: GGUF models through llama-cpp-python's low-level API, one `llama_decode` per engine step.

`runner.load(path, settings)` is registered lazily in `evenflow.backends`; importing this package does not
import llama_cpp.
"""
