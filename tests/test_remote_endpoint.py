"""Remote model addresses and settings (FROM openai+http://...), and the Ollama -> OpenAI option mapping."""
from __future__ import annotations

import pytest

from evenflow.backends.remote import EndpointError, RemoteEndpoint
from evenflow.daemon.api.http.errors import APIError
from evenflow.daemon.api.remote.convert import Reader, chat_messages, sampling
from evenflow.daemon.store.modelfile import ModelfileError, parse_modelfile


def test_from_url_splits_into_api_root_and_model():
    ep = RemoteEndpoint.parse("openai+https://gpu.internal:8000/v1/models/meta-llama/Llama-3.1-70B-Instruct/",
                              {"api_key_env": "CLUSTER_KEY", "timeout": "5m", "connect_timeout": 2})
    assert (ep.base_url, ep.model, ep.api_key_env, ep.timeout, ep.connect_timeout) == (
        "https://gpu.internal:8000/v1", "meta-llama/Llama-3.1-70B-Instruct", "CLUSTER_KEY", 300.0, 2.0)
    assert RemoteEndpoint.from_json(ep.to_json()) == ep
    assert ep.settings() == {"api_key_env": "CLUSTER_KEY", "connect_timeout": 2.0}  # 5m is the default


@pytest.mark.parametrize("url, settings, words", [
    ("http://h:1/v1/models/m", {}, r"openai\+http://HOST"),
    ("openai+http://h:1/v1/chat/completions", {}, "/models/"),
    ("openai+http://h:99999/v1/models/m", {}, "port"),
    ("openai+http://k:sk@h:1/v1/models/m", {}, "credentials"),
    ("openai+http://h:1/v1/models/m?x=1", {}, "must look like"),
    ("openai+http://h:1/v1/models/m", {"timeout": "0s"}, "positive"),
    ("openai+http://h:1/v1/models/m", {"api_key_env": "sk-live-123"}, "environment variable"),
    ("openai+http://h:1/v1/models/m", {"retries": 3}, "unknown remote setting"),
])
def test_bad_addresses_and_settings_say_what_is_expected(url, settings, words):
    with pytest.raises(EndpointError, match=words):
        RemoteEndpoint.parse(url, settings)


def test_modelfile_keeps_remote_settings_and_still_rejects_unknown_parameters():
    spec = parse_modelfile("FROM openai+http://h:1/v1/models/m\nPARAMETER api_key_env K\nPARAMETER top_k 5\n")
    assert spec.parameters == {"top_k": 5, "api_key_env": "K"}
    with pytest.raises(ModelfileError, match="unknown parameter 'api_key'"):
        parse_modelfile("FROM openai+http://h:1/v1/models/m\nPARAMETER api_key sk-123\n")


def test_options_map_to_openai_fields_over_model_defaults():
    out = sampling({"temperature": 0.1, "num_predict": -1, "num_ctx": 8192, "repeat_penalty": 1.1},
                   {"temperature": 0.9, "top_k": 20, "stop": ["</s>"]})
    assert out == {"temperature": 0.1, "top_k": 20, "stop": ["</s>"], "repetition_penalty": 1.1}
    assert sampling({"num_predict": 7}, {})["max_tokens"] == 7
    with pytest.raises(APIError):
        sampling({"num_predict": "many"}, {})


def test_tool_results_name_the_call_they_answer():
    msgs = chat_messages([{"role": "user", "content": "weather?"},
                          {"role": "assistant", "content": "", "tool_calls": [
                              {"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
                          {"role": "tool", "content": "sunny", "tool_name": "weather"}], "be brief", [])
    assert msgs[0] == {"role": "system", "content": "be brief"}
    call = msgs[2]["tool_calls"][0]
    assert call["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}
    assert msgs[3]["tool_call_id"] == call["id"] and msgs[3]["name"] == "weather"


def test_reader_joins_tool_call_fragments_and_rejects_broken_json():
    r = Reader(0)
    for frag in ('{"a": ', '1}'):
        r.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f" if frag[0] == "{" else None, "arguments": frag}}]}}]})
    assert r.tool_calls() == [{"function": {"index": 0, "name": "f", "arguments": {"a": 1}}}]
    bad = Reader(0)
    bad.feed({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{"}}]}}]})
    with pytest.raises(APIError) as e:
        bad.tool_calls()
    assert e.value.status == 502
