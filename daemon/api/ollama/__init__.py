"""Ollama's generation and embedding API (/api/generate, /api/chat, /api/embed, /api/embeddings): its request
models, routes and replies."""
