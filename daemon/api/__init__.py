"""HTTP API: Ollama routes, OpenAI-compatible /v1 routes, events and metrics."""
