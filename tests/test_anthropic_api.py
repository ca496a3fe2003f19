"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) driven by the official `anthropic` client
against a real daemon on loopback: the message and its SSE events, greedy equality with /api/chat, tools (a forced
call really generated under a grammar), thinking, stop reasons and usage, errors in Anthropic's shape, a client
that leaves mid-stream, API keys, and a remote model whose upstream speaks only OpenAI's chat completions."""
from __future__ import annotations

import hashlib
import json
import queue
import time
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import pytest

from api_harness import BACKENDS, Daemon, StepGate, kv_used, start_daemon, upload_model
from remote_upstream import SCRIPTED_MODEL, start_scripted

GREEDY = {"temperature": 0}  # the client no longer types sampling fields; the API still takes them
MSGS = [{"role": "user", "content": "Name a colour"}]

# A Qwen-style template: tools, tool calls and results in history, thinking switched by enable_thinking.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "Answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{% if m.thinking %}<think>{{ m.thinking }}</think>\n"
    "{% endif %}{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n"
    "{% endif %}{% endif %}")
WEATHER = {"name": "get_weather", "description": "the weather for a city",
           "input_schema": {"type": "object", "required": ["city", "days"],
                            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}
OLLAMA_WEATHER = {"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                   "parameters": WEATHER["input_schema"]}}


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("anthropic-api"), backend=request.param, context_length="1024")
    upload_model(d.url, gguf, "tiny")
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    r = httpx.post(d.url + "/api/create", timeout=120, json={"model": "tooly", "files": {gguf.name: digest},
                                                             "template": TOOLS_TEMPLATE, "stream": False})
    assert r.status_code == 200, r.text
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)


def _chat(daemon: Daemon, **body: Any) -> dict[str, Any]:
    r = httpx.post(daemon.url + "/api/chat", json={"stream": False, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _sse(daemon: Daemon, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of a streamed /v1/messages answer, as sent."""
    r = httpx.post(daemon.url + "/v1/messages", json={**body, "stream": True}, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    out = []
    for frame in r.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        data = json.loads(lines["data"])
        assert data["type"] == lines["event"]
        out.append((lines["event"], data))
    return out


def _text(m: Any, kind: str = "text") -> str:
    return "".join(getattr(b, kind) for b in m.content if b.type == kind)


def test_create_is_a_message_with_usage(client: anthropic.Anthropic, daemon: Daemon) -> None:
    m = client.messages.create(model="tiny", max_tokens=12, messages=MSGS, system="Be terse.", extra_body=GREEDY,
                               metadata={"user_id": "u-1"})
    assert m.type == "message" and m.role == "assistant" and m.model == "tiny" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    u = m.usage
    assert u.input_tokens > 0 and u.cache_creation_input_tokens == 0 and u.cache_read_input_tokens == 0
    assert (u.output_tokens == 12) == (m.stop_reason == "max_tokens") and 0 < u.output_tokens <= 12
    # the same conversation on /api/chat, greedy: the same tokens
    o = _chat(daemon, model="tiny", messages=[{"role": "system", "content": "Be terse."}, *MSGS],
              options={"temperature": 0, "num_predict": 12})
    assert o["message"]["content"] == m.content[0].text
    assert (o["prompt_eval_count"], o["eval_count"]) == (u.input_tokens, u.output_tokens)
    assert {"end_turn": "stop", "max_tokens": "length"}[m.stop_reason] == o["done_reason"]


def test_raw_events_in_anthropic_order(client: anthropic.Anthropic, daemon: Daemon) -> None:
    body = {"model": "tiny", "max_tokens": 8, "messages": MSGS}
    events = _sse(daemon, {**body, **GREEDY})
    names = [e for e, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [d["delta"] for e, d in events if e == "content_block_delta"]
    assert all(d["type"] == "text_delta" and d["text"] for d in deltas)
    end = events[-2][1]
    whole = client.messages.create(**body, extra_body=GREEDY)  # the same request whole
    assert "".join(d["text"] for d in deltas) == whole.content[0].text
    assert end["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert end["usage"]["output_tokens"] == whole.usage.output_tokens
    assert end["usage"]["input_tokens"] + end["usage"]["cache_read_input_tokens"] == start["usage"]["input_tokens"]


def test_stream_helper_accumulates_the_message(client: anthropic.Anthropic) -> None:
    kwargs = dict(model="tiny", max_tokens=10, messages=MSGS, extra_body=GREEDY)
    whole = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == final.content[0].text == whole.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


def test_count_tokens_is_the_prompt_of_the_request(client: anthropic.Anthropic, daemon: Daemon) -> None:
    system = "You are a careful assistant. " * 12  # several KV blocks: a second request hits the prefix cache
    n = client.messages.count_tokens(model="tiny", messages=MSGS, system=system).input_tokens
    first = client.messages.create(model="tiny", max_tokens=2, messages=MSGS, system=system, extra_body=GREEDY)
    assert first.usage.input_tokens == n and first.usage.cache_read_input_tokens == 0
    again = client.messages.create(model="tiny", max_tokens=2, messages=MSGS, system=system, extra_body=GREEDY)
    assert again.usage.cache_read_input_tokens > 0  # Anthropic counts cache reads apart from input_tokens
    assert again.usage.input_tokens + again.usage.cache_read_input_tokens == n
    more = client.messages.count_tokens(model="tiny", messages=MSGS + [
        {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one"}], system=system)
    assert more.input_tokens > n
    # a system message mid-conversation (Claude Code's mid-conversation-system beta) renders as /api/chat's would
    mid = [MSGS[0], {"role": "assistant", "content": "Blue."}, {"role": "system", "content": "Be terse."},
           {"role": "user", "content": "Another one"}]
    counted = client.messages.count_tokens(model="tiny", messages=mid).input_tokens
    assert counted == _chat(daemon, model="tiny", messages=mid, options={"num_predict": 1})["prompt_eval_count"]


def test_stop_sequences_and_max_tokens(client: anthropic.Anthropic) -> None:
    base = client.messages.create(model="tiny", max_tokens=16, messages=MSGS, extra_body=GREEDY)
    text = base.content[0].text
    assert len(text) > 6
    stop = text[3:6]
    cut = client.messages.create(model="tiny", max_tokens=16, messages=MSGS, stop_sequences=["zzzq", stop],
                                 extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]
    with client.messages.stream(model="tiny", max_tokens=16, messages=MSGS, stop_sequences=[stop],
                                extra_body=GREEDY) as s:
        streamed = s.get_final_message()
    assert (streamed.stop_reason, streamed.stop_sequence, _text(streamed)) == ("stop_sequence", stop, _text(cut))
    short = client.messages.create(model="tiny", max_tokens=3, messages=MSGS, extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3 and text.startswith(_text(short))


def test_tool_history_renders_as_on_api_chat(client: anthropic.Anthropic, daemon: Daemon) -> None:
    history = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use the tool", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris", "days": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "22C, sunny"}]},
            {"type": "text", "text": "and tomorrow?"}]},
    ]
    m = client.messages.create(model="tooly", max_tokens=10, system="Weather desk.", messages=history,
                               tools=[WEATHER], thinking={"type": "disabled"}, extra_body=GREEDY)
    o = _chat(daemon, model="tooly", think=False, tools=[OLLAMA_WEATHER], options={"temperature": 0, "num_predict": 10},
              messages=[{"role": "system", "content": "Weather desk."}, history[0],
                        {"role": "assistant", "content": "Checking.", "thinking": "use the tool",
                         "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}]},
                        {"role": "tool", "content": "22C, sunny", "tool_name": "get_weather"},
                        {"role": "user", "content": "and tomorrow?"}])
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == o["prompt_eval_count"]
    assert _text(m) == o["message"]["content"] and m.usage.output_tokens == o["eval_count"]
    # the tool's answer reaches the prompt: a longer one is more tokens; an error is marked
    longer = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "22C, sunny, light wind from the west"},
        {"type": "text", "text": "and tomorrow?"}]}]
    failed = [*history[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_01", "content": "22C, sunny", "is_error": True},
        {"type": "text", "text": "and tomorrow?"}]}]
    counts = [client.messages.count_tokens(model="tooly", system="Weather desk.", messages=h, tools=[WEATHER],
                                           thinking={"type": "disabled"}).input_tokens
              for h in (history, longer, failed)]
    assert counts[1] > counts[0] and counts[2] > counts[0]
    assert counts[0] == o["prompt_eval_count"]


def test_forced_tool_call_comes_back_as_tool_use(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "weather in Oslo for 3 days?"}]
    for choice in ({"type": "tool", "name": "get_weather"}, {"type": "any"}):
        m = client.messages.create(model="tooly", max_tokens=200, messages=ask, tools=[WEATHER], tool_choice=choice,
                                   thinking={"type": "disabled"}, extra_body=GREEDY)
        assert m.stop_reason == "tool_use" and [b.type for b in m.content] == ["tool_use"]
        call = m.content[0]
        assert call.name == "get_weather" and call.id.startswith("toolu_")
        assert call.input["city"] in ("Paris", "Oslo", "Lima") and 1 <= call.input["days"] <= 7
    with client.messages.stream(model="tooly", max_tokens=200, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}, thinking={"type": "disabled"},
                                extra_body=GREEDY) as s:
        events = list(s)
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.content[0].input == call.input  # greedy: the same call, whole or streamed
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert [d.type for d in deltas] == ["input_json_delta"] and json.loads(deltas[0].partial_json) == call.input
    # tool_choice none: the tools leave the prompt
    with_tools = client.messages.count_tokens(model="tooly", messages=ask, tools=[WEATHER])
    without = client.messages.count_tokens(model="tooly", messages=ask, tools=[WEATHER], tool_choice={"type": "none"})
    assert without.input_tokens < with_tools.input_tokens


def test_thinking_enabled_and_disabled(client: anthropic.Anthropic, daemon: Daemon) -> None:
    ask = [{"role": "user", "content": "why is the sky blue?"}]
    on = client.messages.create(model="tooly", max_tokens=8, messages=ask, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": 1024})
    o = _chat(daemon, model="tooly", think=True, messages=ask, options={"temperature": 0, "num_predict": 8})
    assert on.content[0].type == "thinking" and on.content[0].signature and on.content[0].thinking
    assert _text(on, "thinking") == o["message"].get("thinking", "") and _text(on) == o["message"]["content"]
    off = client.messages.create(model="tooly", max_tokens=8, messages=ask, extra_body=GREEDY,
                                 thinking={"type": "disabled"})
    o = _chat(daemon, model="tooly", think=False, messages=ask, options={"temperature": 0, "num_predict": 8})
    assert all(b.type == "text" for b in off.content) and _text(off) == o["message"]["content"]
    assert off.usage.input_tokens + off.usage.cache_read_input_tokens > on.usage.input_tokens  # the closed section
    with client.messages.stream(model="tooly", max_tokens=8, messages=ask, extra_body=GREEDY,
                                thinking={"type": "enabled", "budget_tokens": 1024}) as s:
        kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in s
                 if e.type.startswith(("message_", "content_block_"))]  # the raw events, not the helper's own
        final = s.get_final_message()
    assert final.content[0].thinking == on.content[0].thinking and final.content[0].signature
    blocks_end = kinds.index(("content_block_stop", None))
    assert kinds[blocks_end - 1] == ("content_block_delta", "signature_delta")  # the signature closes the block
    with pytest.raises(anthropic.BadRequestError) as e:  # a model whose template has no thinking
        client.messages.create(model="tiny", max_tokens=4, messages=ask, thinking={"type": "enabled",
                                                                                    "budget_tokens": 1024})
    assert "does not support thinking" in e.value.message


def test_errors_in_anthropic_shape(client: anthropic.Anthropic, daemon: Daemon) -> None:
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="no-such-model", max_tokens=4, messages=MSGS)
    assert nf.value.body["error"]["type"] == "not_found_error" and "not found" in nf.value.message
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    bad = [
        (dict(max_tokens=4, messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}]),
         "does not support images"),
        (dict(max_tokens=0, messages=MSGS), "max_tokens"),
        (dict(max_tokens=4, messages=[{"role": "robot", "content": "hi"}]), "role"),
        (dict(max_tokens=4, messages=[]), "at least one message"),
        (dict(max_tokens=4, messages=MSGS, tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}),
         "not one of the request's tools"),
        (dict(max_tokens=4, messages=MSGS, tools=[{"type": "web_search_20250305", "name": "web_search"}]),
         "server tools"),
        (dict(max_tokens=4, messages=MSGS, tools=[WEATHER]), "does not support tools"),  # tiny's template
    ]
    for kwargs, words in bad:
        with pytest.raises(anthropic.BadRequestError) as e:
            client.messages.create(model="tiny", **kwargs)
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"
        assert words in e.value.message, (kwargs, e.value.message)
    for raw in (b"{not json", json.dumps({"model": "tiny", "max_tokens": "4", "messages": MSGS}).encode(),
                json.dumps({"model": "tiny", "messages": MSGS}).encode()):
        r = httpx.post(daemon.url + "/v1/messages", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]  # required, as on Anthropic's API
    r = httpx.get(daemon.url + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = httpx.post(daemon.url + "/v1/chat/completions", content=b"{not json")  # the rest of /v1 keeps OpenAI's shape
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_disconnect_mid_stream_frees_the_kv(daemon: Daemon) -> None:
    gate = StepGate(daemon, "tiny")
    engine = daemon.ctx.manager.models["tiny:latest"].engine
    seen: queue.Queue[dict[str, Any]] = queue.Queue()
    unsubscribe = engine.subscribe(lambda ev: seen.put(ev) if ev.get("type") == "request" else None)
    try:
        gate.allow(8)  # the prompt and a few tokens; then the engine waits with the sequence holding its KV
        body = {"model": "tiny", "max_tokens": 1000, "stream": True, "messages": MSGS, **GREEDY}
        with httpx.stream("POST", daemon.url + "/v1/messages", json=body, timeout=120) as r:
            lines = r.iter_lines()  # kept: a generator dropped mid-way closes the connection (aborts the request)
            deltas = 0
            while deltas < 3:
                deltas += next(lines) == "event: content_block_delta"
            assert kv_used(daemon, "tiny:latest") > 0
        deadline = time.monotonic() + 60  # the abort reaches the engine's inbox once the server sees the close
        while not engine._inbox and time.monotonic() < deadline:
            time.sleep(0.01)
        gate.open()
        while True:
            ev = seen.get(timeout=60)
            if ev["event"] == "finished":
                break
        assert ev["done_reason"] == "abort" and ev["user"]["endpoint"] == "/v1/messages"
    finally:
        gate.close()
        unsubscribe()
    deadline = time.monotonic() + 60
    while kv_used(daemon, "tiny:latest") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kv_used(daemon, "tiny:latest") == 0 and engine.stats().running == 0


# ----------------------------------------------------------------------------------- API key

KEY = "sk-anthropic-test-5d1c9e2b7a"


def test_api_key_as_x_api_key_or_bearer(tmp_path: Path, synthetic_model) -> None:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path, backend=BACKENDS[0], api_key=KEY, context_length="512")
    try:
        upload_model(d.url, gguf, "tiny", headers={"Authorization": f"Bearer {KEY}"})
        for c in (anthropic.Anthropic(base_url=d.url, api_key=KEY, max_retries=0),  # x-api-key
                  anthropic.Anthropic(base_url=d.url, auth_token=KEY, max_retries=0)):  # Authorization: Bearer
            assert c.messages.create(model="tiny", max_tokens=2, messages=MSGS).usage.output_tokens > 0
            assert c.messages.count_tokens(model="tiny", messages=MSGS).input_tokens > 0
        for c in (anthropic.Anthropic(base_url=d.url, api_key="wrong-key-0123456789", max_retries=0),
                  anthropic.Anthropic(base_url=d.url, auth_token="wrong-key-0123456789", max_retries=0)):
            with pytest.raises(anthropic.AuthenticationError) as e:
                c.messages.create(model="tiny", max_tokens=2, messages=MSGS)
            assert e.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                               "message": "unauthorized: invalid API key"}}
        r = httpx.post(d.url + "/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": MSGS})
        assert r.status_code == 401 and "x-api-key" in r.json()["error"]["message"]
        r = httpx.post(d.url + "/v1/messages", json={"model": "tiny", "max_tokens": 2, "messages": MSGS},
                       headers={"x-api-key": KEY, "Authorization": "Bearer wrong-key-0123456789"})
        assert r.status_code == 401  # both sent: both must hold the key
        r = httpx.post(d.url + "/v1/chat/completions", headers={"x-api-key": KEY},
                       json={"model": "tiny", "messages": MSGS})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"  # OpenAI's /v1: Bearer only
    finally:
        d.stop()


# ----------------------------------------------------------------------------------- remote model

@pytest.fixture(scope="module")
def remote_daemon(tmp_path_factory) -> Iterator[tuple[Daemon, Any]]:
    scripted = start_scripted()
    d = start_daemon(tmp_path_factory.mktemp("anthropic-remote"))
    r = httpx.post(d.url + "/api/create", timeout=60, json={
        "model": "script", "from": f"openai+{scripted.url}/v1/models/{SCRIPTED_MODEL}", "stream": False,
        "system": "Model card system."})
    assert r.status_code == 200, r.text
    yield d, scripted.script
    d.stop()
    scripted.stop()


def test_remote_model_answers_through_chat_completions(remote_daemon) -> None:
    d, script = remote_daemon
    script.reset()
    c = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0)
    m = c.messages.create(model="script", max_tokens=50, messages=MSGS, stop_sequences=["###"],
                          extra_body={"temperature": 0.5, "top_k": 7})
    assert _text(m) == "Hello, remote world!" and m.stop_reason == "end_turn" and m.model == "script"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (3, 5)
    sent = script.requests[-1]
    assert sent["path"] == "/v1/chat/completions"
    assert sent["body"]["messages"] == [{"role": "system", "content": "Model card system."}, *MSGS]
    assert (sent["body"]["max_tokens"], sent["body"]["stop"], sent["body"]["temperature"], sent["body"]["top_k"]) == \
        (50, ["###"], 0.5, 7)
    script.mode = "think"
    with c.messages.stream(model="script", max_tokens=50, messages=MSGS,
                           thinking={"type": "enabled", "budget_tokens": 2000}) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == "let me think"
    assert text == "Hello, remote world!" and script.requests[-1]["body"]["chat_template_kwargs"] == \
        {"enable_thinking": True}
    script.mode = "tools"
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "get_weather",
                                                  "input": {"city": "Lima", "days": 2}}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "hot"}]}]
    m = c.messages.create(model="script", max_tokens=50, messages=history, tools=[WEATHER],
                          tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use" and m.content[-1].type == "tool_use"
    assert (m.content[-1].name, m.content[-1].input) == ("weather", {"city": "Paris"})
    body = script.requests[-1]["body"]
    assert body["tools"] == [OLLAMA_WEATHER] and body["tool_choice"] == "required"
    assert body["messages"][-1] == {"role": "tool", "content": "hot", "tool_call_id": "toolu_9",
                                    "name": "get_weather"}
    assert body["messages"][-2]["tool_calls"][0]["id"] == "toolu_9"
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.count_tokens(model="script", messages=MSGS)
    assert "remote models" in e.value.message
