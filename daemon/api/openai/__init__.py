"""OpenAI's API (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models): routes and replies."""
