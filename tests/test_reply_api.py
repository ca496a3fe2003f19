"""Reply formats wired through a real daemon: the architecture and template reach the parser on every generation
API, gpt-oss's think levels are accepted as Ollama accepts them, and a model whose format nobody knows answers
with its text as content and one log line, never an error. (Random weights write no markup: the family bytes
themselves travel this path in the scripted-model tests.)"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import anthropic
import httpx
import ollama
import openai
import pytest

from api_harness import Daemon, start_daemon, upload_model
from reply_samples import TOOLS

# the parts of gpt-oss's template that matter here: its markers, reasoning_effort, tools
HARMONY_TEMPLATE = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
    "{% if tools %}<|start|>developer<|message|>{% for t in tools %}{{ t.function.name }} {% endfor %}<|end|>"
    "{% endif %}{% for m in messages %}{% if m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
UNKNOWN_TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                    "{% if tools %}Tools: {{ tools | tojson }} -- call them <<like this>>{% endif %}[assistant] ")
GREEDY = {"temperature": 0, "num_predict": 8}
MSGS = [{"role": "user", "content": "weather in Paris?"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("reply-api"), backend="llamacpp", context_length="1024")
    upload_model(d.url, gguf, "tiny")
    c = ollama.Client(host=d.url)
    c.create(model="harmony", from_="tiny", template=HARMONY_TEMPLATE)
    c.create(model="unknown", from_="tiny", template=UNKNOWN_TEMPLATE)
    yield d
    d.stop()


def test_gpt_oss_template_gives_tools_and_thinking(daemon: Daemon) -> None:
    c = ollama.Client(host=daemon.url)
    assert {"tools", "thinking"} <= set(c.show("harmony").capabilities or [])
    for think in (True, False, "max"):
        r = c.chat("harmony", messages=MSGS, tools=TOOLS, think=think, options=GREEDY)
        assert r.done_reason in ("stop", "length")


def _streams_agree(daemon: Daemon, model: str) -> None:
    """Every generation API answers streamed and whole, and both say the same."""
    c = ollama.Client(host=daemon.url)
    whole = c.chat(model, messages=MSGS, tools=TOOLS, options=GREEDY)
    parts = list(c.chat(model, messages=MSGS, tools=TOOLS, options=GREEDY, stream=True))
    assert "".join((p.message.thinking or "") + p.message.content for p in parts) == \
        (whole.message.thinking or "") + whole.message.content
    gen = c.generate(model, "weather in Paris?", options=GREEDY)
    gen_parts = list(c.generate(model, "weather in Paris?", options=GREEDY, stream=True))
    assert "".join((p.thinking or "") + p.response for p in gen_parts) == (gen.thinking or "") + gen.response
    oa = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x")
    cc = oa.chat.completions.create(model=model, messages=MSGS, tools=TOOLS, temperature=0, max_tokens=8)
    chunks = list(oa.chat.completions.create(model=model, messages=MSGS, tools=TOOLS, temperature=0, max_tokens=8,
                                             stream=True))
    assert "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices) == \
        (cc.choices[0].message.content or "")
    rs = oa.responses.create(model=model, input="weather in Paris?", temperature=0, max_output_tokens=8,
                             tools=[{"type": "function", **TOOLS[0]["function"]}])
    assert rs.status in ("completed", "incomplete")  # incomplete: max_output_tokens reached
    an = anthropic.Anthropic(base_url=daemon.url, api_key="x")
    tool = {"name": "get_weather", "description": "weather", "input_schema": TOOLS[0]["function"]["parameters"]}
    msg = an.messages.create(model=model, max_tokens=8, messages=MSGS, tools=[tool], extra_body={"temperature": 0})
    with an.messages.stream(model=model, max_tokens=8, messages=MSGS, tools=[tool],
                            extra_body={"temperature": 0}) as s:
        streamed = s.get_final_message()
    assert [b.model_dump() for b in streamed.content] == [b.model_dump() for b in msg.content]


def test_harmony_model_on_every_api(daemon: Daemon) -> None:
    _streams_agree(daemon, "harmony")


def test_unknown_format_is_content_and_one_log_line(daemon: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    c = ollama.Client(host=daemon.url)
    assert "tools" in (c.show("unknown").capabilities or [])
    with caplog.at_level(logging.WARNING, logger="evenflow.daemon.prompt.formats"):
        _streams_agree(daemon, "unknown")
        r = httpx.post(daemon.url + "/api/chat", json={"model": "unknown", "messages": MSGS, "tools": TOOLS,
                                                       "options": GREEDY, "stream": False}, timeout=120)
    assert r.status_code == 200 and r.json()["message"].get("tool_calls") is None
    lines = [rec.getMessage() for rec in caplog.records if "unknown reply format" in rec.getMessage()]
    assert len(lines) == 1 and "sha256:" in lines[0] and "[{{ m.role }}]" in lines[0]
