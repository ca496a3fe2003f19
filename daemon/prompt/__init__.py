"""The conversation's text format, both ways: a model's chat template (Jinja or Ollama's Go templates) rendering
messages, tools and thinking into a prompt (templates.py), and the model's output read back in the template's
terms, thinking sections and tool calls (reply.py, tools.py). No model, no tokenizer, no HTTP here."""
