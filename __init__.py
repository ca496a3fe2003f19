"""evenflow: a local LLM inference daemon with an Ollama-compatible API and chunked-prefill scheduling."""
__version__ = "0.1.0"
