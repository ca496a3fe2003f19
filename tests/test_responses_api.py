"""The OpenAI Responses API (/v1/responses) driven by the official `openai` client against a real daemon: the same
conversation as /v1/chat/completions gives the same greedy text and token counts, streamed events come in order,
the client's stream helper and `parse` work, and what a stateless local server cannot do is a clear 400."""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from api_harness import BACKENDS, Daemon, StepGate, kv_used, start_daemon, upload_model
from remote_upstream import SCRIPTED_MODEL, start_scripted

INSTRUCTIONS = "Be terse."
QUESTION = "Name a colour"
CHAT = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]

# a Hermes/Qwen-style template: tools as <tool_call>, and the answer opens a <think> section
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n"
    "Answer with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is not false %}<think>\n"
    "{% endif %}{% endif %}")
# a Llama-3-style template: a tool call is the whole answer, as JSON {"name", "parameters"}
LLAMA3_TEMPLATE = (
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\nTo call a function answer with "
    "{\"name\": function name, \"parameters\": an object}.{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "<|eot_id|>{% endif %}"
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n{{ m.content }}<|eot_id|>"
    "{% endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n{% endif %}")
WEATHER = {"name": "get_weather", "description": "weather for a city",
           "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}


def _create(url: str, gguf: Path, name: str, template: str) -> None:
    digest = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()  # the blob upload_model sent
    r = httpx.post(url + "/api/create", json={"model": name, "files": {gguf.name: digest}, "template": template,
                                              "stream": False}, timeout=120)
    assert r.status_code == 200, r.text


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("responses-api"), backend=request.param, context_length="1024")
    upload_model(d.url, gguf, "tiny")
    _create(d.url, gguf, "hermes", HERMES_TEMPLATE)
    _create(d.url, gguf, "llama3", LLAMA3_TEMPLATE)
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


def _sse(daemon: Daemon, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The raw (event name, data) pairs of a streamed response."""
    out: list[tuple[str, dict[str, Any]]] = []
    with httpx.stream("POST", daemon.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                assert name is not None
                out.append((name, json.loads(line[len("data: "):])))
                name = None
    return out


def test_create_matches_chat_completions(client: openai.OpenAI, daemon: Daemon) -> None:
    chat = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0)
    r = client.responses.create(model="tiny", instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=12,
                                temperature=0, metadata={"k": "v"}, user="u1", store=False)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    [msg] = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    if chat.choices[0].finish_reason == "length":  # the random model rarely stops by itself
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
        assert msg.status == "incomplete" and r.usage.output_tokens == 12
    else:
        assert r.status == "completed" and r.incomplete_details is None
    assert r.instructions == INSTRUCTIONS and r.metadata == {"k": "v"} and r.user == "u1"
    assert r.temperature == 0 and r.max_output_tokens == 12 and r.store is False and r.error is None
    # the same conversation as input items (parts, a developer message) is the same prompt and the same answer
    items = client.responses.create(model="tiny", max_output_tokens=12, temperature=0, input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": INSTRUCTIONS}]},
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}])
    assert items.output_text == r.output_text and items.usage.input_tokens == r.usage.input_tokens
    metrics = httpx.get(daemon.url + "/metrics").text
    assert 'evenflow_http_requests_total{endpoint="/v1/responses",status="200"}' in metrics


def test_history_with_assistant_turns_matches_chat(client: openai.OpenAI) -> None:
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"},
               {"role": "user", "content": "and now?"}]
    # sampled, not greedy: the same seed (our extension here, as on /v1/chat/completions) gives the same sample
    chat = client.chat.completions.create(model="tiny", messages=history, max_tokens=8, temperature=0.9, seed=3)
    r = client.responses.create(model="tiny", max_output_tokens=8, temperature=0.9, extra_body={"seed": 3}, input=[
        history[0], {"type": "message", "role": "assistant", "status": "completed", "id": "msg_1",
                     "content": [{"type": "output_text", "text": "hello there", "annotations": []}]}, history[2]])
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens


def test_stream_events_in_order(daemon: Daemon, client: openai.OpenAI) -> None:
    body = {"model": "tiny", "input": QUESTION, "instructions": INSTRUCTIONS, "max_output_tokens": 12,
            "temperature": 0}
    whole = client.responses.create(**body)
    events = _sse(daemon, body)
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    kinds = [name for name, _ in events]
    deltas = [d for n, d in events if n == "response.output_text.delta"]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * len(deltas),
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.incomplete" if whole.status == "incomplete" else "response.completed"]
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    item_id = events[2][1]["item"]["id"]
    assert all(d["item_id"] == item_id and d["output_index"] == 0 for d in deltas)
    text = "".join(d["delta"] for d in deltas)
    assert text == whole.output_text == events[-4][1]["text"]
    final = events[-1][1]["response"]
    assert final["id"] == events[0][1]["response"]["id"] and final["status"] == whole.status
    assert final["output"][0]["id"] == item_id and final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == whole.usage.output_tokens
    assert final["usage"]["input_tokens"] == whole.usage.input_tokens


class Colour(BaseModel):
    name: str = Field(max_length=12)
    bright: bool


COLOUR_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                  "bright": {"type": "boolean"}},
                 "required": ["name", "bright"], "additionalProperties": False}


def test_json_schema_format_and_the_stream_helper(client: openai.OpenAI) -> None:
    fmt = {"format": {"type": "json_schema", "name": "colour", "schema": COLOUR_SCHEMA, "strict": True}}
    r = client.responses.create(model="tiny", input=QUESTION, text=fmt, temperature=0, max_output_tokens=200)
    assert r.status == "completed"  # the grammar ends the answer when the object is closed
    jsonschema.validate(json.loads(r.output_text), COLOUR_SCHEMA)
    assert r.text.format.type == "json_schema" and r.text.format.name == "colour"
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                          temperature=0, max_tokens=200, response_format={
                                              "type": "json_schema", "json_schema": {"name": "colour",
                                                                                     "schema": COLOUR_SCHEMA}})
    assert r.output_text == chat.choices[0].message.content
    with client.responses.stream(model="tiny", input=QUESTION, text=fmt, temperature=0,
                                 max_output_tokens=200) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == "".join(deltas) == r.output_text
    assert final.usage.output_tokens == r.usage.output_tokens
    parsed = client.responses.parse(model="tiny", input=QUESTION, text_format=Colour, temperature=0,
                                    max_output_tokens=200)
    assert isinstance(parsed.output_parsed, Colour)
    obj = client.responses.create(model="tiny", input=QUESTION, text={"format": {"type": "json_object"}},
                                  temperature=0, max_output_tokens=30)
    same = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                          temperature=0, max_tokens=30, response_format={"type": "json_object"})
    assert obj.output_text == same.choices[0].message.content and obj.output_text.startswith("{")
    if obj.status == "completed":  # any object, so the random model may go on past 30 tokens
        assert isinstance(json.loads(obj.output_text), dict)


def test_max_output_tokens_is_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="tiny", input="tell a long story", max_output_tokens=3, temperature=0)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3 and r.output[-1].status == "incomplete"


def test_function_call_round_trip_renders_like_chat(client: openai.OpenAI) -> None:
    """function_call and function_call_output items render as the assistant's tool call and the tool message."""
    call_args = json.dumps({"city": "Paris"})

    def items(output: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": "weather in Paris?"},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": call_args},
                {"type": "function_call_output", "call_id": "call_1", "output": output}]

    chat = client.chat.completions.create(
        model="hermes", temperature=0, max_tokens=8, reasoning_effort="none",
        tools=[{"type": "function", "function": WEATHER}],
        messages=[{"role": "user", "content": "weather in Paris?"},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": call_args}}]},
                  {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])
    r = client.responses.create(model="hermes", temperature=0, max_output_tokens=8, reasoning={"effort": "none"},
                                tools=[{"type": "function", **WEATHER, "strict": False}], input=items("sunny, 21 C"))
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content and r.output[0].type == "message"
    assert r.tools[0].name == "get_weather" and r.tools[0].type == "function"
    # the call's output is in the prompt: a longer one is more tokens
    longer = client.responses.create(model="hermes", temperature=0, max_output_tokens=1,
                                     reasoning={"effort": "none"}, tools=[{"type": "function", **WEATHER}],
                                     input=items("sunny, 21 C, light wind from the west, no rain expected"))
    assert longer.usage.input_tokens > r.usage.input_tokens + 5
    # tool_choice "none": the tools are not offered, so the prompt is shorter
    none = client.responses.create(model="hermes", temperature=0, max_output_tokens=1, tool_choice="none",
                                   reasoning={"effort": "none"}, tools=[{"type": "function", **WEATHER}],
                                   input=items("sunny, 21 C"))
    assert none.usage.input_tokens < r.usage.input_tokens and none.tool_choice == "none"


CALL_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
               "properties": {"name": {"const": "get_weather"},
                              "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                                             "properties": {"city": {"type": "string", "maxLength": 10}}}}}


def test_function_call_output_items(client: openai.OpenAI, daemon: Daemon) -> None:
    """A model whose tool-call format is a JSON answer, held to the call's shape by text.format, answers with a
    function_call item (read back by the same parser as /v1/chat/completions)."""
    fmt = {"format": {"type": "json_schema", "name": "call", "schema": CALL_SCHEMA}}
    tools = [{"type": "function", **WEATHER}]
    r = client.responses.create(model="llama3", input="weather in Paris?", tools=tools, text=fmt, temperature=0,
                                max_output_tokens=100)
    assert r.status == "completed" and r.output_text == ""
    [call] = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    args = json.loads(call.arguments)
    jsonschema.validate(args, CALL_SCHEMA["properties"]["parameters"])
    chat = client.chat.completions.create(
        model="llama3", messages=[{"role": "user", "content": "weather in Paris?"}], temperature=0, max_tokens=100,
        tools=[{"type": "function", "function": WEATHER}],
        response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": CALL_SCHEMA}})
    assert json.loads(chat.choices[0].message.tool_calls[0].function.arguments) == args
    events = _sse(daemon, {"model": "llama3", "input": "weather in Paris?", "tools": tools, "text": fmt,
                           "temperature": 0, "max_output_tokens": 100})
    kinds = [n for n, _ in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert json.loads(events[4][1]["arguments"]) == args and events[2][1]["item"]["arguments"] == ""
    with client.responses.stream(model="llama3", input="weather in Paris?", tools=tools, text=fmt, temperature=0,
                                 max_output_tokens=100) as stream:
        final = stream.get_final_response()
    [item] = final.output
    assert item.type == "function_call" and json.loads(item.arguments) == args
    # a function in a `namespace` tool (Codex groups some this way) is offered like the others; its call names it
    grouped = client.responses.create(model="llama3", input="weather in Paris?", text=fmt, temperature=0,
                                      max_output_tokens=100, tools=[{"type": "namespace", "name": "geo",
                                                                     "description": "places", "tools": tools}])
    assert grouped.output[0].namespace == "geo" and json.loads(grouped.output[0].arguments) == args
    assert grouped.usage.input_tokens == r.usage.input_tokens


def test_reasoning_effort_maps_to_thinking(client: openai.OpenAI, daemon: Daemon) -> None:
    msgs = [{"role": "user", "content": "think first"}]
    chat = client.chat.completions.create(model="hermes", messages=msgs, temperature=0, max_tokens=10,
                                          reasoning_effort="high")
    r = client.responses.create(model="hermes", input="think first", temperature=0, max_output_tokens=10,
                                reasoning={"effort": "high"})
    thought = chat.choices[0].message.model_extra["reasoning"]
    assert thought and r.output[0].type == "reasoning" and r.output[0].id.startswith("rs_")
    assert r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == thought
    assert r.reasoning.effort == "high"
    assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
    assert r.output_text == (chat.choices[0].message.content or "")
    events = _sse(daemon, {"model": "hermes", "input": "think first", "temperature": 0, "max_output_tokens": 10,
                           "reasoning": {"effort": "high"}})
    kinds = [n for n, _ in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[3][1]["part"] == {"type": "reasoning_text", "text": ""}
    assert "".join(d["delta"] for n, d in events if n == "response.reasoning_text.delta") == thought
    assert "response.reasoning_text.done" in kinds
    # effort none turns thinking off: no reasoning item, the answer is the chat's with reasoning_effort none
    off_chat = client.chat.completions.create(model="hermes", messages=msgs, temperature=0, max_tokens=10,
                                              reasoning_effort="none")
    off = client.responses.create(model="hermes", input="think first", temperature=0, max_output_tokens=10,
                                  reasoning={"effort": "none"})
    assert [i.type for i in off.output] == ["message"] and off.output_text == off_chat.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as exc:  # a model whose template cannot think
        client.responses.create(model="tiny", input="x", reasoning={"effort": "high"})
    assert "does not support thinking" in exc.value.message


def _error(daemon: Daemon, body: Any, status: int = 400, raw: bool = False) -> dict[str, Any]:
    r = httpx.post(daemon.url + "/v1/responses", **({"content": body} if raw else {"json": body}), timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == ("invalid_request_error" if status == 400 else "not_found_error")
    return err


def test_errors(client: openai.OpenAI, daemon: Daemon) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input="x", previous_response_id="resp_123")
    assert "previous_response_id is not supported" in exc.value.message
    assert exc.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input=[{"role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]}])
    assert "does not support images" in exc.value.message  # tiny has no projector
    with pytest.raises(openai.NotFoundError) as exc:
        client.responses.create(model="no-such-model", input="x")
    assert "not found" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}])
    assert "tool type 'web_search' is not supported" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(model="tiny", input="x", background=True)
    assert "background" in exc.value.message
    assert "JSON" in _error(daemon, b"{not json", raw=True)["message"]
    assert "temperature" in _error(daemon, {"model": "tiny", "input": "x", "temperature": "hot"})["message"]
    assert _error(daemon, {"model": "tiny", "input": 5})["param"] == "input"
    assert _error(daemon, {"model": "tiny", "input": []})["param"] == "input"
    assert _error(daemon, {"model": "tiny", "input": "x", "conversation": "conv_1"})["param"] == "conversation"
    assert _error(daemon, {"model": "tiny", "input": [{"type": "item_reference", "id": "msg_1"}]})["param"] == "input"
    assert _error(daemon, {"model": "tiny", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                                                        "arguments": "not json"}]})["param"] == "input"
    assert _error(daemon, {"model": "tiny", "input": "x", "text": {"format": {"type": "xml"}}})["param"] == "text"
    assert _error(daemon, {"model": "tiny", "input": "x", "reasoning": {"effort": "huge"}})["param"] == "reasoning"
    assert _error(daemon, {"model": "tiny", "input": "x", "max_output_tokens": 0})["param"] == "max_output_tokens"
    tools = [{"type": "function", **WEATHER}]
    assert "not supported for local models" in _error(daemon, {"model": "hermes", "input": "x", "tools": tools,
                                                                "tool_choice": "required"})["message"]
    assert _error(daemon, {"model": "hermes", "input": "x", "tools": tools, "tool_choice": {
        "type": "function", "name": "other"}})["param"] == "tool_choice"
    _error(daemon, {"model": "missing", "input": "x"}, status=404)
    # store: true is accepted; nothing is stored, which the response says
    r = client.responses.create(model="tiny", input="x", store=True, max_output_tokens=2)
    assert r.store is False and r.status == "incomplete"


def _aborted(daemon: Daemon) -> float:
    prefix = 'evenflow_sequences_finished_total{model="tiny:latest",reason="abort"}'
    return sum(float(line.split()[-1]) for line in httpx.get(daemon.url + "/metrics").text.splitlines()
               if line.startswith(prefix))


def test_disconnect_mid_stream_frees_kv(daemon: Daemon) -> None:
    gate = StepGate(daemon, "tiny")
    aborted = _aborted(daemon)
    try:
        gate.allow(4)
        body = {"model": "tiny", "input": "a long story", "max_output_tokens": 500, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", daemon.url + "/v1/responses", json=body, timeout=60) as r:
            lines = r.iter_lines()  # kept: a generator dropped mid-way closes the connection
            while next(lines) != "event: response.output_text.delta":
                pass
            deadline = time.monotonic() + 30  # the engine uses its permits up and parks: its stats are published
            while not gate.parked and time.monotonic() < deadline:
                time.sleep(0.01)
            assert gate.parked and kv_used(daemon, "tiny:latest") > 0  # held mid-answer: the request is running
        gate.open()  # the engine runs on and sees the abort
        deadline = time.monotonic() + 30
        while kv_used(daemon, "tiny:latest") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kv_used(daemon, "tiny:latest") == 0
        assert daemon.ctx.manager.models["tiny:latest"].engine.stats().running == 0
        assert _aborted(daemon) == aborted + 1  # aborted, not run to its end
    finally:
        gate.close()


# ------------------------------------------------------------------------------------------ a remote model

@pytest.fixture(scope="module")
def remote(tmp_path_factory) -> Iterator[tuple[Daemon, Any]]:
    scripted = start_scripted()
    d = start_daemon(tmp_path_factory.mktemp("responses-remote"))
    r = httpx.post(d.url + "/api/create", json={"model": "script", "stream": False,
                                                "from": f"openai+{scripted.url}/v1/models/{SCRIPTED_MODEL}"})
    assert r.status_code == 200, r.text
    yield d, scripted
    d.stop()
    scripted.stop()


def test_remote_model_answers_through_its_upstream_chat(remote) -> None:
    d, scripted = remote
    script = scripted.script
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0)
    script.reset()
    r = client.responses.create(model="script", instructions="be brief", input="q", max_output_tokens=50,
                                temperature=0.5)
    assert r.output_text == "Hello, remote world!" and r.status == "completed" and r.model == "script"
    assert r.usage.input_tokens == 3 and r.usage.output_tokens == 5
    sent = script.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["body"]["model"] == SCRIPTED_MODEL
    assert sent["body"]["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]
    assert sent["body"]["max_tokens"] == 50 and sent["body"]["temperature"] == 0.5
    with client.responses.stream(model="script", input="q") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == "Hello, remote world!"
    script.reset("think")
    r = client.responses.create(model="script", input="q", reasoning={"effort": "low"})
    assert [i.type for i in r.output] == ["reasoning", "message"] and r.output[0].content[0].text == "let me think"
    assert script.requests[-1]["body"]["reasoning_effort"] == "low"
    script.reset("tools")
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    r = client.responses.create(model="script", input="weather?", tools=tools, tool_choice="required")
    [call] = r.output
    assert call.type == "function_call" and call.name == "weather" and json.loads(call.arguments) == {"city": "Paris"}
    body = script.requests[-1]["body"]
    assert body["tools"] == [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    assert body["tool_choice"] == "required"  # the upstream engine enforces it
    with client.responses.stream(model="script", input="weather?", tools=tools) as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "function_call" and final.output[0].name == "weather"
    script.reset("error500")
    with pytest.raises(openai.APIStatusError) as exc:
        client.responses.create(model="script", input="q")
    assert exc.value.status_code == 502
