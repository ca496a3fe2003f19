"""The conversation's text format, both ways: a model's chat template (Jinja or Ollama's Go templates) rendering
messages, tools and thinking into a prompt (templates.py; gpt-oss's harmony prompt side in harmony.py), and the
model's output read back in its family's terms, thinking sections and tool calls: which family (formats.py), its
call syntax (toolsyntax.py, callargs.py), the streaming parsers (reply.py, harmony.py). No model, no tokenizer,
no HTTP here."""
