"""The `remote` model kind: an OpenAI-compatible engine elsewhere (vLLM, SGLang, llama-server) serves it."""
from .client import Upstream, UpstreamError, UpstreamPool, UpstreamStream
from .endpoint import SETTING_KEYS, EndpointError, RemoteEndpoint, is_remote_from

__all__ = ["EndpointError", "RemoteEndpoint", "SETTING_KEYS", "Upstream", "UpstreamError", "UpstreamPool",
           "UpstreamStream", "is_remote_from"]
