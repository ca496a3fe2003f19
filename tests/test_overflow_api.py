"""A prompt longer than the window, on every API, with the official clients: /api/* cuts it as Ollama does (a chat
keeps its system prompt and latest message, tool calls keep their results; a single prompt keeps its start and end)
and says so (the final response, a header, /api/events, the log); `truncate: false` is a 400 with the numbers;
/v1/* answer OpenAI's context_length_exceeded unless asked to truncate, /v1/messages Anthropic's `prompt is too
long`; a generation that fills the window shifts it on /api/* (Ollama's `shift`) and stops on /v1/*."""
from __future__ import annotations

import hashlib
import json
import logging
import queue
import re
import threading
from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import ollama
import openai
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

WINDOW = 256
GREEDY = {"temperature": 0, "num_predict": 6}
HEADER = "x-evenflow-truncated"
TOOLS_TEMPLATE = (  # Qwen-style: tools, tool calls and their results in the history
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}{% for c in m.tool_calls or [] %}"
    "<tool_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    backend = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
    d = start_daemon(tmp_path_factory.mktemp("overflow"), backend=backend, context_length=str(WINDOW))
    upload_model(d.url, gguf, "tiny")
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    r = httpx.post(d.url + "/api/create", timeout=120, json={"model": "tooly", "files": {gguf.name: digest},
                                                             "template": TOOLS_TEMPLATE, "stream": False})
    assert r.status_code == 200, r.text
    yield d
    d.stop()


@pytest.fixture()
def http(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=300) as c:
        yield c


def long_chat(turns: int = 30) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You answer in one word."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"question {i}: what comes after {i}?"},
                 {"role": "assistant", "content": f"{i + 1} " * 4}]
    return msgs + [{"role": "user", "content": "and the last question?"}]


def refused_tokens(r: httpx.Response) -> int:
    """The prompt's tokens from a 400 `the prompt is N tokens but ...`."""
    assert r.status_code == 400, r.text
    return int(re.search(r"the prompt is (\d+) tokens", r.json()["error"]).group(1))


class Events:
    """/api/events read in a thread; `wait(pred)` returns the first event matching."""

    def __init__(self, url: str) -> None:
        self.q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.ready = threading.Event()
        threading.Thread(target=self._read, args=(url,), daemon=True).start()
        assert self.ready.wait(60)

    def _read(self, url: str) -> None:
        try:
            with httpx.stream("GET", url + "/api/events", timeout=None) as r:
                for line in r.iter_lines():
                    ev = json.loads(line)
                    if ev["type"] == "hello":
                        self.ready.set()
                    self.q.put(ev)
        except httpx.HTTPError:  # the daemon stopped at the end of the module
            return

    def wait(self, pred) -> dict[str, Any]:
        while True:
            ev = self.q.get(timeout=120)
            if pred(ev):
                return ev


def test_a_long_chat_keeps_its_system_prompt_and_latest_message(daemon: Daemon, http: httpx.Client,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    msgs = long_chat()
    events = Events(daemon.url)
    caplog.set_level(logging.WARNING, logger="evenflow.daemon.api.overflow")
    # the official client keeps working where a 400 used to end the conversation
    reply = ollama.Client(host=daemon.url).chat(model="tiny", messages=msgs, options=GREEDY)
    assert reply.done and reply.prompt_eval_count < WINDOW
    r = http.post("/api/chat", json={"model": "tiny", "messages": msgs, "options": GREEDY, "stream": False})
    body = r.json()
    cut = body["truncated"]
    assert r.headers[HEADER] == f"messages={cut['messages']}, tokens={cut['tokens']}"
    assert reply.message.content == body["message"]["content"]
    kept = [msgs[0]] + msgs[1 + cut["messages"]:]
    assert kept[1]["role"] == "user" and kept[-1] == msgs[-1]  # cut where a turn starts; the latest message stays
    # the same as sending only what was kept (nothing else changed), and the numbers add up
    same = http.post("/api/chat", json={"model": "tiny", "messages": kept, "options": GREEDY, "stream": False,
                                        "truncate": False}).json()
    assert same["prompt_eval_count"] == body["prompt_eval_count"] and same["message"] == body["message"]
    assert "truncated" not in same and HEADER not in http.post("/api/chat", json={
        "model": "tiny", "messages": kept, "options": GREEDY, "stream": False}).headers
    whole = refused_tokens(http.post("/api/chat", json={"model": "tiny", "messages": msgs, "truncate": False}))
    assert whole == body["prompt_eval_count"] + cut["tokens"]
    # one turn more would not have fitted: the fewest turns went
    more = [msgs[0]] + msgs[cut["messages"] - 1:]
    assert refused_tokens(http.post("/api/chat", json={"model": "tiny", "messages": more, "truncate": False})) \
        >= WINDOW
    # said out loud: the event, the log line, and the streamed answer's last line and header
    ev = events.wait(lambda e: e.get("event") == "truncated")
    assert (ev["messages"], ev["tokens"], ev["window"], ev["user"]["endpoint"]) == \
        (cut["messages"], cut["tokens"], WINDOW, "/api/chat")
    assert any("did not fit the context of 256 tokens" in m and f"dropped {cut['messages']} oldest messages" in m
               for m in caplog.messages)
    with http.stream("POST", "/api/chat", json={"model": "tiny", "messages": msgs, "options": GREEDY}) as s:
        lines = [json.loads(x) for x in s.iter_lines()]
        assert s.headers[HEADER] == r.headers[HEADER]
    assert lines[-1]["done"] and lines[-1]["truncated"] == cut
    assert all("truncated" not in x for x in lines[:-1])


def test_truncate_false_is_a_400_with_the_numbers(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url)  # its chat() has no `truncate`: the same request through its transport
    with pytest.raises(ollama.ResponseError) as e:
        client._request(ollama.ChatResponse, "POST", "/api/chat",
                        json={"model": "tiny", "messages": long_chat(), "truncate": False, "stream": False})
    assert e.value.status_code == 400
    assert re.search(r"the prompt is \d+ tokens but the context length of model 'tiny:latest' is 256 tokens",
                     e.value.error) and "`truncate` is false" in e.value.error


def test_tool_calls_keep_their_results(http: httpx.Client) -> None:
    call = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "lookup",
                                                                            "arguments": {"q": "x"}}}]}
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Use the tools."}]
    for i in range(12):  # turns that each use a tool
        msgs += [{"role": "user", "content": f"look up {i}"}, call, {"role": "tool", "content": f"found {i} " * 3},
                 {"role": "assistant", "content": f"it is {i}"}]
    loop = msgs + [{"role": "user", "content": "long question " * 60}, call, {"role": "tool", "content": "found"}]
    for chat, least in ((msgs + [{"role": "user", "content": "and now?"}], None), (loop, 3)):
        body = http.post("/api/chat", json={"model": "tooly", "messages": chat, "tools": TOOLS, "options": GREEDY,
                                            "stream": False}).json()
        cut = body["truncated"]["messages"]
        kept = [chat[0]] + chat[1 + cut:]
        assert kept[1]["role"] != "tool" and kept[-1] == chat[-1]
        if least is not None:  # the last user turn is too long: its tool call and result are what stays
            assert kept[1:] == chat[-2:]
        else:
            assert kept[1]["role"] == "user"
        same = http.post("/api/chat", json={"model": "tooly", "messages": kept, "tools": TOOLS, "options": GREEDY,
                                            "stream": False, "truncate": False}).json()
        assert same["prompt_eval_count"] == body["prompt_eval_count"]
    huge = [msgs[0], {"role": "user", "content": "word " * 400}]  # the latest message alone: refused, never cut
    r = http.post("/api/chat", json={"model": "tiny", "messages": huge, "stream": False})
    assert "with only its system messages and latest message kept (a message is never cut)" in r.json()["error"]
    assert refused_tokens(r) >= WINDOW


def test_openai_context_length_exceeded_unless_asked_to_truncate(daemon: Daemon, http: httpx.Client) -> None:
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    msgs = long_chat()
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "messages"
    assert "maximum context length is 256 tokens" in e.value.message and '"truncation": "auto"' in e.value.message
    raw = client.chat.completions.with_raw_response.create(model="tiny", messages=msgs, max_tokens=4, temperature=0,
                                                           extra_body={"truncation": "auto"})
    done = raw.parse()
    ollama_way = http.post("/api/chat", json={"model": "tiny", "messages": msgs, "stream": False,
                                              "options": {"temperature": 0, "num_predict": 4}}).json()
    assert done.model_extra["truncated"] == ollama_way["truncated"] and raw.headers[HEADER]
    assert done.usage.prompt_tokens == ollama_way["prompt_eval_count"]
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, max_tokens=4, stream=True,
                                                 extra_body={"truncation": "auto"}))
    assert chunks[-1].choices[0].finish_reason and chunks[-1].model_extra["truncated"] == ollama_way["truncated"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=msgs, extra_body={"truncation": "sometimes"})
    assert e.value.param == "truncation"
    # legacy completions: the prompt's start and end, as /api/generate
    prompt = "word " * 600
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert e.value.code == "context_length_exceeded" and e.value.param == "prompt"
    c = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, extra_body={"truncation": "auto"})
    assert c.model_extra["truncated"]["tokens"] > 0 and c.usage.prompt_tokens < WINDOW
    # Responses: its own `truncation` ("disabled" by default, as OpenAI's)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input=msgs[1:], instructions=msgs[0]["content"], max_output_tokens=4)
    assert e.value.code == "context_length_exceeded" and e.value.param == "input"
    assert "exceeds the context window" in e.value.message
    resp = client.responses.create(model="tiny", input=msgs[1:], instructions=msgs[0]["content"],
                                   max_output_tokens=4, truncation="auto")
    assert resp.truncation == "auto" and resp.model_extra["truncated"]["messages"] > 0


def test_anthropic_says_prompt_is_too_long(daemon: Daemon) -> None:
    client = anthropic.Anthropic(base_url=daemon.url, api_key="unused", max_retries=0)
    msgs = [m for m in long_chat() if m["role"] != "system"]
    n = client.messages.count_tokens(model="tiny", messages=msgs).input_tokens
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="tiny", max_tokens=4, messages=msgs)
    assert e.value.status_code == 400 and n > WINDOW
    assert e.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                       "message": f"prompt is too long: {n} tokens > 256 maximum"}}


def test_generate_keeps_the_prompts_start_and_end(daemon: Daemon, http: httpx.Client) -> None:
    tok = daemon.ctx.manager.models["tiny:latest"].runner.tokenizer
    keep = 4 + (1 if tok.add_bos else 0)  # num_keep 4, after BOS (Ollama's count)
    limit = WINDOW - (WINDOW - keep) // 2  # what Ollama's runner keeps: about half the window left for the reply
    prompt = "".join(f"w{i} " for i in range(300))
    whole = refused_tokens(http.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True,
                                                            "truncate": False}))
    r = http.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                         "options": GREEDY})
    body = r.json()
    assert body["prompt_eval_count"] == limit and body["truncated"] == {"messages": 0, "tokens": whole - limit}
    assert r.headers[HEADER] == f"messages=0, tokens={whole - limit}" and "context" not in body
    # templated: `context` holds the prompt kept; its start is the template's, its end the prompt's last words
    short = http.post("/api/generate", json={"model": "tiny", "prompt": "w0", "stream": False,
                                             "options": GREEDY}).json()
    long = http.post("/api/generate", json={"model": "tiny", "prompt": prompt, "stream": False,
                                            "options": GREEDY}).json()
    kept = long["context"][: long["prompt_eval_count"]]
    assert len(kept) == limit and kept[:keep] == short["context"][:keep]
    assert tok.decode(kept[-40:]).find("w299") >= 0
    wider = http.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                             "options": {**GREEDY, "num_keep": 20}}).json()
    assert wider["prompt_eval_count"] == WINDOW - (WINDOW - 20 - (keep - 4)) // 2
    # far over what the window could hold in any tokenization: cut from its ends, the dropped count estimated
    huge = http.post("/api/generate", json={"model": "tiny", "prompt": "hello " * 100_000, "raw": True,
                                            "stream": False, "options": GREEDY}).json()
    assert huge["prompt_eval_count"] == limit and huge["truncated"]["approximate"] is True
    assert huge["truncated"]["tokens"] > 50_000
    r = http.post("/api/generate", json={"model": "tiny", "prompt": "hello " * 100_000, "raw": True,
                                         "truncate": False})
    assert r.status_code == 400 and "can hold: over" in r.json()["error"]


def test_a_full_window_shifts_on_ollamas_api_and_stops_on_openais(daemon: Daemon, http: httpx.Client) -> None:
    prompt = "".join(f"w{i} " for i in range(60))
    opts = {"temperature": 0, "num_predict": 200, "ignore_eos": True}
    body = http.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                            "options": opts}).json()
    n = body["prompt_eval_count"]
    assert n + 200 > WINDOW and body["eval_count"] == 200 and body["done_reason"] == "length"
    tok = daemon.ctx.manager.models["tiny:latest"].runner.tokenizer
    keep = 4 + (1 if tok.add_bos else 0)
    assert body["truncated"] == {"shifts": 1, "shifted_tokens": (WINDOW - keep) // 2}
    stopped = http.post("/api/generate", json={"model": "tiny", "prompt": prompt, "raw": True, "stream": False,
                                               "shift": False, "options": opts}).json()
    assert stopped["eval_count"] == WINDOW - n and "truncated" not in stopped
    assert body["response"].startswith(stopped["response"])  # the same until the window filled
    client = openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)
    c = client.completions.create(model="tiny", prompt=prompt, max_tokens=200, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == WINDOW - n
