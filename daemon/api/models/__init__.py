"""The model routes (Ollama's /api/tags, /api/show, /api/pull, /api/create, /api/copy, /api/delete, /api/ps) and the
adapter from the model store to the model manager."""
