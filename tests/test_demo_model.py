"""The `demo` model as a front-end's first contact: a Qwen3-style template with tools and thinking, so Open WebUI's
default chat (its built-in tools with every /api/chat) and `think` are answered, never refused."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from api_harness import BACKENDS, Daemon, start_daemon
from evenflow.backends.synthetic.tokenizer import QWEN3_TEMPLATE
from evenflow.daemon.prompt.templates import render_messages, template_capabilities, tool_format_for

# What Open WebUI's native function calling sends with a chat: its built-in tools, as JSON-schema functions.
OPEN_WEBUI_TOOLS = [
    {"type": "function", "function": {
        "name": "get_current_timestamp", "description": "Get the current Unix timestamp in seconds.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
    {"type": "function", "function": {
        "name": "search_web", "description": "Search the public web for information.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "The search query to look up"},
            "count": {"type": "integer", "description": "Number of results to return", "default": 5}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "query_knowledge_files", "description": "Search the knowledge files attached to this chat.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for"},
            "knowledge_ids": {"type": "array", "items": {"type": "string"}, "description": "Restrict to these"}},
            "required": ["query"]}}},
]
HELLO = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0, "seed": 7, "num_predict": 8}

CONVERSATIONS = [
    ([{"role": "user", "content": "hello"}], None, None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}], OPEN_WEBUI_TOOLS, True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}], None, False),
    ([{"role": "user", "content": "time?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"function": {"name": "search_web", "arguments": {"query": "time", "count": 2}}}]},
      {"role": "tool", "content": "noon"}, {"role": "tool", "content": "UTC"}], OPEN_WEBUI_TOOLS, True),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nb"},
      {"role": "user", "content": "c"}], None, True),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "x", "reasoning_content": "r"},
      {"role": "user", "content": "c"}, {"role": "assistant", "content": "y", "reasoning_content": "r2"}], None, None),
]


@pytest.mark.parametrize("messages,tools,think", CONVERSATIONS)
def test_qwen3_template_renders_as_qwen3s_own(fixtures_dir: Path, messages, tools, think) -> None:
    """Our Qwen3-style template (written for evenflow) renders conversations exactly as Qwen3's real one does."""
    real = (fixtures_dir / "chat-templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    gen = messages[-1]["role"] != "assistant"
    ours = render_messages(QWEN3_TEMPLATE, messages, tools=tools, think=think, add_generation_prompt=gen)
    assert ours == render_messages(real, messages, tools=tools, think=think, add_generation_prompt=gen)


def test_qwen3_template_capabilities() -> None:
    assert template_capabilities(QWEN3_TEMPLATE) == ["tools", "thinking"]
    assert tool_format_for(QWEN3_TEMPLATE) == "hermes"
    off = render_messages(QWEN3_TEMPLATE, HELLO, think=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_messages(QWEN3_TEMPLATE, HELLO, think=True).endswith("<|im_start|>assistant\n")


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory) -> Iterator[Daemon]:
    d = start_daemon(tmp_path_factory.mktemp("demo-front"), backend=request.param, no_demo=False)
    yield d
    d.stop()


@pytest.fixture()
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=300) as c:
        yield c


def test_demo_capabilities_come_from_its_template(http: httpx.Client) -> None:
    info = http.post("/api/show", json={"model": "demo"}).json()
    assert info["capabilities"] == ["completion", "tools", "thinking"]
    assert info["capabilities"] == ["completion", *template_capabilities(info["template"])]
    assert info["details"]["family"] == "qwen3" and "<tool_call>" in info["template"]


def _lines(r: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in r.iter_lines() if line.strip()]


@pytest.mark.parametrize("think", [None, True, False, "high"])
def test_open_webui_chat_with_tools_and_think_is_answered(http: httpx.Client, think) -> None:
    """Open WebUI's first "hello": tools every time, `think` as the user left it; streamed and not, never refused."""
    body = {"model": "demo", "messages": HELLO, "tools": OPEN_WEBUI_TOOLS, "options": {"num_predict": 16},
            **({"think": think} if think is not None else {})}
    r = http.post("/api/chat", json={**body, "stream": False})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["done"] and reply["message"]["role"] == "assistant"
    assert reply["eval_count"] == 16 or reply["done_reason"] == "stop"  # random weights seldom end on <|im_end|>
    with http.stream("POST", "/api/chat", json=body) as s:
        assert s.status_code == 200
        lines = _lines(s)
    assert all("error" not in line for line in lines) and lines[-1]["done"]
    assert lines[-1]["prompt_eval_count"] == reply["prompt_eval_count"]


def test_chat_prompt_is_the_qwen3_render(http: httpx.Client) -> None:
    """/api/chat with tools and think=false equals /api/generate raw on the template's own render (greedy)."""
    info = http.post("/api/show", json={"model": "demo"}).json()
    chat = http.post("/api/chat", json={"model": "demo", "messages": HELLO, "tools": OPEN_WEBUI_TOOLS, "think": False,
                                        "stream": False, "options": GREEDY}).json()
    prompt = render_messages(info["template"], HELLO, tools=OPEN_WEBUI_TOOLS, think=False)
    assert "<tools>" in prompt and prompt.endswith("<think>\n\n</think>\n\n")
    raw = http.post("/api/generate", json={"model": "demo", "prompt": prompt, "raw": True, "think": False,
                                           "stream": False, "options": GREEDY}).json()
    assert chat["prompt_eval_count"] == raw["prompt_eval_count"]
    assert chat["message"]["content"] == raw["response"] and chat["eval_count"] == raw["eval_count"]


def test_openai_chat_with_tools_and_reasoning_on_demo(daemon: Daemon) -> None:
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    r = oai.chat.completions.create(model="demo", messages=HELLO, tools=OPEN_WEBUI_TOOLS, max_tokens=8)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls") and r.usage.completion_tokens <= 8
    r = oai.chat.completions.create(model="demo", messages=HELLO, tools=OPEN_WEBUI_TOOLS, max_tokens=8,
                                    reasoning_effort="high")
    assert r.usage.completion_tokens <= 8
    chunks = list(oai.chat.completions.create(model="demo", messages=HELLO, tools=OPEN_WEBUI_TOOLS, max_tokens=8,
                                              stream=True))
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons in (["length"], ["stop"], ["tool_calls"])


def _ps(http: httpx.Client) -> dict[str, int]:
    return {m["name"]: m["context_length"] for m in http.get("/api/ps").json()["models"]}


def test_demo_window_fits_a_front_ends_first_prompt(http: httpx.Client) -> None:
    """Open WebUI's built-in tools alone are ~9,000 demo tokens: demo's PARAMETER num_ctx (16384) is its window."""
    info = http.post("/api/show", json={"model": "demo"}).json()
    assert "num_ctx" in info["parameters"] and info["model_info"]["qwen3.context_length"] == 32768
    system = "Use the tools when they help. " * 900  # a long system prompt, as front-ends send with their tools
    r = http.post("/api/chat", json={"model": "demo", "messages": [{"role": "system", "content": system}, *HELLO],
                                     "tools": OPEN_WEBUI_TOOLS, "stream": False, "options": {"num_predict": 4}})
    assert r.status_code == 200, r.text
    assert r.json()["prompt_eval_count"] > 4096  # over the daemon's default window, under demo's
    assert _ps(http)["demo:latest"] == 16384


def test_model_parameter_num_ctx_sets_the_window(http: httpx.Client) -> None:
    """Ollama's precedence: a request's num_ctx, else the model's PARAMETER num_ctx, else the daemon's default."""
    r = http.post("/api/create", json={"model": "demo-6k", "from": "demo", "parameters": {"num_ctx": 6000},
                                       "stream": False})
    assert r.status_code == 200, r.text
    assert http.post("/api/generate", json={"model": "demo-6k"}).status_code == 200  # loads it
    assert _ps(http)["demo-6k:latest"] == 6000
    r = http.post("/api/generate", json={"model": "demo-6k", "prompt": "word " * 7000, "stream": False,
                                         "truncate": False, "options": {"num_predict": 1}})
    assert r.status_code == 400 and "context length of model 'demo-6k:latest' is 6000 tokens" in r.json()["error"]
    r = http.post("/api/generate", json={"model": "demo-6k", "prompt": "hi", "stream": False,
                                         "options": {"num_predict": 1, "num_ctx": 8192}})
    assert r.status_code == 200 and _ps(http)["demo-6k:latest"] == 8192  # the request's num_ctx wins (a reload)
    assert http.request("DELETE", "/api/delete", json={"model": "demo-6k"}).status_code == 200
