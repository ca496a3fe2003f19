"""Structured outputs over HTTP (Ollama's `format`, OpenAI's `response_format`) through the official clients,
then the libraries that depend on them (LangChain, LiteLLM, OpenAI `.parse()`). The model has random weights:
only the grammar can make its output valid JSON."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Iterator, Literal

import httpx
import jsonschema
import ollama
import openai
import pytest
from pydantic import BaseModel, ConfigDict, Field

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 2},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                 "required": ["city"], "additionalProperties": False},
    },
    "required": ["name", "age", "pets", "home"],
    "additionalProperties": False,
}
GREEDY = {"temperature": 0, "num_predict": 200}
MSGS = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module", params=BACKENDS)
def daemon(request, tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("format-api"), backend=request.param, context_length="1024")
    upload_model(d.url, gguf, "tiny")
    d.backend = request.param  # type: ignore[attr-defined]
    yield d
    d.stop()


@pytest.fixture()
def client(daemon: Daemon) -> ollama.Client:
    return ollama.Client(host=daemon.url)


@pytest.fixture()
def oai(daemon: Daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0)


# The client-library tests exercise the API, not the backend: they run on the first backend's daemon.
first_backend_only = pytest.mark.parametrize("daemon", BACKENDS[:1], indirect=True)


def test_generate_format_json_streams_like_unstreamed(client: ollama.Client) -> None:
    full = client.generate("tiny", "A JSON object:", format="json", options=GREEDY)
    assert full.done_reason == "stop" and isinstance(json.loads(full.response), dict)
    parts = list(client.generate("tiny", "A JSON object:", format="json", options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == full.response and parts[-1].done_reason == "stop"


def test_chat_format_schema_validates(client: ollama.Client) -> None:
    full = client.chat("tiny", messages=MSGS, format=PERSON, options=GREEDY)
    jsonschema.validate(json.loads(full.message.content), PERSON)
    parts = list(client.chat("tiny", messages=MSGS, format=PERSON, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == full.message.content
    sampled = client.chat("tiny", messages=MSGS, format=PERSON, options={"temperature": 1.0, "seed": 5,
                                                                          "num_predict": 300})
    jsonschema.validate(json.loads(sampled.message.content), PERSON)


def test_a_schema_the_engine_cannot_compile_is_a_400(client: ollama.Client, daemon: Daemon) -> None:
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat("tiny", messages=MSGS, format={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})
    assert exc.value.status_code == 400 and "nowhere" in exc.value.error
    r = httpx.post(daemon.url + "/api/generate", json={"model": "tiny", "prompt": "x", "format": 3})
    assert r.status_code == 400
    assert r.json() == {"error": 'invalid format: 3; expected "json" or a valid JSON Schema object'}


def test_a_schema_that_requires_itself_is_a_400(client: ollama.Client) -> None:
    """No finite JSON value has a required property "a" that is the whole schema again: refused up front."""
    with pytest.raises(ollama.ResponseError) as exc:
        client.chat("tiny", messages=MSGS, format={"type": "object", "properties": {"a": {"$ref": "#"}},
                                                    "required": ["a"]})
    assert exc.value.status_code == 400 and "no finite JSON value satisfies this schema" in exc.value.error


class Country(BaseModel):
    """ollama-python's structured-outputs example (strings bounded: a random model would fill them forever)."""

    model_config = ConfigDict(extra="forbid")  # the schema has no additionalProperties; Ollama's grammar adds none
    name: str = Field(max_length=8)
    population: int
    languages: list[Annotated[str, Field(max_length=6)]] = Field(max_length=2)


def test_pydantic_format_without_additional_properties(client: ollama.Client) -> None:
    for options in (GREEDY, {"temperature": 1.0, "seed": 3, "num_predict": 200}):
        r = client.chat("tiny", messages=MSGS, format=Country.model_json_schema(), options=options)
        assert r.done_reason == "stop", r.message.content
        Country.model_validate_json(r.message.content)


def test_response_format_on_both_v1_endpoints(oai: openai.OpenAI) -> None:
    r = oai.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=200,
                                    response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict) and r.choices[0].finish_reason == "stop"
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    r = oai.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=200, response_format=rf)
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    chunks = list(oai.chat.completions.create(model="tiny", messages=MSGS, temperature=0, max_tokens=200,
                                              response_format=rf, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    c = oai.completions.create(model="tiny", prompt="JSON:", temperature=0, max_tokens=200,
                               extra_body={"response_format": rf})
    jsonschema.validate(json.loads(c.choices[0].text), PERSON)
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="tiny", messages=MSGS, response_format={"type": "json_schema"})
    assert "json_schema.schema" in exc.value.message


class Home(BaseModel):
    city: str = Field(max_length=6)


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)
    pets: list[Literal["cat", "dog"]] = Field(max_length=2)
    home: Home


@first_backend_only
def test_openai_parse(oai: openai.OpenAI, daemon: Daemon) -> None:
    r = oai.chat.completions.parse(model="tiny", messages=MSGS, temperature=0, max_tokens=300, response_format=Person)
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and 0 <= person.age <= 120 and len(person.name) <= 8


@first_backend_only
def test_langchain_with_structured_output(daemon: Daemon) -> None:
    from langchain_ollama import ChatOllama

    llm = ChatOllama(model="tiny", base_url=daemon.url, temperature=0, num_predict=300)
    person = llm.with_structured_output(Person).invoke("Describe a person.")  # method="json_schema" (default)
    assert isinstance(person, Person)
    as_dict = llm.with_structured_output(PERSON, method="json_schema").invoke("Describe a person.")
    jsonschema.validate(as_dict, PERSON)
    free = llm.with_structured_output(PERSON, method="json_mode").invoke("Return a JSON object.")  # format "json"
    assert isinstance(free, dict)


@first_backend_only
def test_litellm_ollama_with_tools(daemon: Daemon) -> None:
    """LiteLLM's ollama/ provider sends format "json" whenever tools are given and parses the JSON it gets."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price list
    import litellm

    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                             "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                            "required": ["city"]}}}
    r = litellm.completion(model="ollama/tiny", api_base=daemon.url, messages=MSGS, tools=[tool], temperature=0,
                           max_tokens=200)
    msg = r.choices[0].message
    if msg.tool_calls:  # the JSON it produced had the shape of a call
        json.loads(msg.tool_calls[0].function.arguments)
    else:
        assert isinstance(json.loads(msg.content), dict)


# ---- the other API gaps the same clients found

@first_backend_only
def test_empty_model_is_required_everywhere(daemon: Daemon, oai: openai.OpenAI) -> None:
    for path, body in (("/api/chat", {"messages": MSGS}), ("/api/show", {}), ("/api/embed", {"input": "x"})):
        r = httpx.post(daemon.url + path, json={"model": "", **body})
        assert (r.status_code, r.json()) == (400, {"error": "model is required"}), path
    r = httpx.post(daemon.url + "/api/generate", json={"model": "", "prompt": "x"})  # Ollama's generate: a 404
    assert (r.status_code, r.json()) == (404, {"error": "model '' not found"})
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(model="", messages=MSGS)
    assert "model is required" in exc.value.message


@first_backend_only
def test_completions_stream_usage_is_null_until_the_last_chunk(oai: openai.OpenAI) -> None:
    chunks = list(oai.completions.create(model="tiny", prompt="Hello", max_tokens=6, temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert len(chunks) > 1 and all(c.usage is None for c in chunks[:-1])


@first_backend_only
@pytest.mark.parametrize("path,body", [("/v1/chat/completions", {"messages": MSGS}), ("/v1/completions", {"prompt": "Hi"})])
def test_with_include_usage_every_chunk_carries_usage_null_on_the_wire(daemon, path: str, body: dict) -> None:
    """OpenAI's wire format: the key is there and null (a client model's default None would hide its absence)."""
    with httpx.stream("POST", daemon.url + path, json={"model": "tiny", "max_tokens": 5, "temperature": 0,
                                                       "stream": True, "stream_options": {"include_usage": True},
                                                       **body}) as r:
        objs = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert objs[-1]["choices"] == [] and objs[-1]["usage"]["completion_tokens"] > 0
    assert len(objs) > 2 and all("usage" in o and o["usage"] is None for o in objs[:-1])


def test_thinking_detected_from_what_a_jinja_template_does_with_enable_thinking() -> None:
    from evenflow.daemon.prompt.templates import template_capabilities

    switching = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                 "{% if enable_thinking %}Reasoning: on\n{% endif %}assistant:")
    assert "thinking" in template_capabilities(switching)  # no <think> tag anywhere, yet it switches
    ignoring = switching.replace("{% if enable_thinking %}Reasoning: on\n{% endif %}", "{# enable_thinking #}")
    assert "thinking" not in template_capabilities(ignoring)  # names the variable, does nothing with it
