"""Remote models: an OpenAI-compatible engine elsewhere (vLLM, SGLang, llama-server) serves them, never our
engine. serve.py answers each endpoint through the upstream, hub.py keeps the connection pools, health and the
lookup of a name, convert.py maps Ollama's requests to the upstream's and its replies back. The upstream client
itself is backends/remote."""
from .hub import lookup, ps_rows, show_info
from .serve import serve

__all__ = ["lookup", "ps_rows", "serve", "show_info"]
