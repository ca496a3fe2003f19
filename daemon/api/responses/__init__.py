"""OpenAI's Responses API (/v1/responses): translated to a chat completion, with its own reply."""
