"""Remote models: an OpenAI-compatible engine elsewhere (vLLM, SGLang, llama-server) serves them, never our
engine. Their requests run the one pipeline like a local model's (pipeline/generation.py): the upstream engine is
another source of deltas (pipeline/upstream_stream.py), and the dialects' replies read it as they read ours.
hub.py keeps the connection pools, health and request events, calls.py makes one upstream call, convert.py the
terms a dialect's prepare step builds the upstream request in and the reader of its chunks, relay.py passes
/v1's requests through as they are. Nothing here writes a dialect's reply. The upstream client is backends/remote."""
from .calls import embeddings
from .convert import UpstreamRequest
from .hub import RemoteModel, ensure, ps_rows, remote_model, show_info
from .relay import relay

__all__ = ["RemoteModel", "UpstreamRequest", "embeddings", "ensure", "ps_rows", "relay", "remote_model", "show_info"]
