"""Settings: Ollama's variables, EVENFLOW_ twins, Go durations, host parsing, bad values naming the variable."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from evenflow.daemon.settings import (SETTINGS, ConfigError, keep_alive_seconds, load_settings, parse_go_duration,
                                    parse_host)


def test_defaults() -> None:
    s = load_settings({})
    assert (s.host.host, s.host.port, s.host.scheme) == ("127.0.0.1", 11434, "http")
    assert s.keep_alive == 300.0 and s.max_queue == 512 and s.context_length == 0  # 0 = by VRAM
    assert s.backend == "auto" and s.prefill == "chunked" and s.log_content is False
    assert s.loaded_model_limit == 3


@pytest.mark.parametrize("text,expected", [
    ("0.0.0.0", ("http", "0.0.0.0", 11434)),
    ("0.0.0.0:8080", ("http", "0.0.0.0", 8080)),
    ("http://example.com", ("http", "example.com", 80)),
    ("https://example.com", ("https", "example.com", 443)),
    ("https://example.com:1234/path", ("https", "example.com", 1234)),
    ("[::1]:5000", ("http", "::1", 5000)),
    ("  'localhost:7'  ", ("http", "localhost", 7)),
])
def test_parse_host(text: str, expected: tuple) -> None:
    hp = parse_host(text)
    assert (hp.scheme, hp.host, hp.port) == expected


def test_twin_wins_and_ollama_names_work() -> None:
    s = load_settings({"OLLAMA_HOST": "0.0.0.0:1", "EVENFLOW_HOST": "127.0.0.1:2", "OLLAMA_NUM_PARALLEL": "4",
                       "OLLAMA_MAX_LOADED_MODELS": "2", "OLLAMA_MAX_QUEUE": "7", "OLLAMA_CONTEXT_LENGTH": "2048",
                       "OLLAMA_ORIGINS": "http://a.example, https://*.b.example", "EVENFLOW_LOG_CONTENT": "1"})
    assert s.host.port == 2 and s.host.is_loopback
    assert (s.num_parallel, s.max_loaded_models, s.max_queue, s.context_length) == (4, 2, 7, 2048)
    assert s.origins == ["http://a.example", "https://*.b.example"]
    assert s.log_content is True


def test_evenflow_own_settings() -> None:
    s = load_settings({"EVENFLOW_BACKEND": "llamacpp", "EVENFLOW_PREFILL": "monolithic",
                       "EVENFLOW_MAX_BATCHED_TOKENS": "128", "EVENFLOW_TARGET_ITL_MS": "40", "EVENFLOW_MAX_SEQS": "3",
                       "EVENFLOW_NUM_THREADS": "2", "EVENFLOW_OLLAMA_STORE": "/tmp/x", "EVENFLOW_NO_DEMO": "true",
                       "EVENFLOW_GPU_KV_FRACTION": "0.5"})
    assert (s.backend, s.prefill, s.max_batched_tokens, s.target_itl_ms) == ("llamacpp", "monolithic", 128, 40.0)
    assert (s.max_seqs, s.num_threads, str(s.ollama_store), s.no_demo) == (3, 2, "/tmp/x", True)
    assert s.gpu_kv_fraction == 0.5 and load_settings({}).gpu_kv_fraction == 0.9


def test_overrides_beat_env() -> None:
    s = load_settings({"OLLAMA_MAX_QUEUE": "7"}, {"max_queue": "9", "backend": None})
    assert s.max_queue == 9 and s.backend == "auto"


@pytest.mark.parametrize("text,seconds", [("5m", 300), ("1h30m", 5400), ("300ms", 0.3), ("1.5h", 5400), ("0", 0),
                                          ("-1m", -60), ("2h45m30s", 9930)])
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


def test_keep_alive_env_and_request_forms() -> None:
    assert load_settings({"OLLAMA_KEEP_ALIVE": "300"}).keep_alive == 300
    assert load_settings({"OLLAMA_KEEP_ALIVE": "10m"}).keep_alive == 600
    assert load_settings({"OLLAMA_KEEP_ALIVE": "0"}).keep_alive == 0
    assert math.isinf(load_settings({"OLLAMA_KEEP_ALIVE": "-1"}).keep_alive)
    assert math.isinf(keep_alive_seconds("-5m")) and keep_alive_seconds(2.5) == 2.5
    with pytest.raises(ValueError):
        keep_alive_seconds("300")  # a string needs a unit, as in Ollama's api.Duration
    with pytest.raises(ValueError):
        keep_alive_seconds(True)


@pytest.mark.parametrize("env,var", [
    ({"OLLAMA_NUM_PARALLEL": "many"}, "OLLAMA_NUM_PARALLEL"),
    ({"OLLAMA_MAX_QUEUE": "0"}, "OLLAMA_MAX_QUEUE"),
    ({"EVENFLOW_BACKEND": "cuda"}, "EVENFLOW_BACKEND"),
    ({"EVENFLOW_PREFILL": "sometimes"}, "EVENFLOW_PREFILL"),
    ({"OLLAMA_KEEP_ALIVE": "5 minutes"}, "OLLAMA_KEEP_ALIVE"),
    ({"EVENFLOW_HOST": "ftp://x"}, "EVENFLOW_HOST"),
    ({"EVENFLOW_TARGET_ITL_MS": "-3"}, "EVENFLOW_TARGET_ITL_MS"),
    ({"EVENFLOW_LOG_CONTENT": "maybe"}, "EVENFLOW_LOG_CONTENT"),
    ({"OLLAMA_CONTEXT_LENGTH": "4k"}, "OLLAMA_CONTEXT_LENGTH"),
    ({"EVENFLOW_GPU_KV_FRACTION": "1.5"}, "EVENFLOW_GPU_KV_FRACTION"),
    ({"EVENFLOW_GPU_KV_FRACTION": "0"}, "EVENFLOW_GPU_KV_FRACTION"),
])
def test_bad_values_name_the_variable(env: dict, var: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(env)
    assert var in str(exc.value) and "expected" in str(exc.value)


def test_cli_lists_every_setting_and_exits_2_on_bad_value() -> None:
    out = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "serve", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for spec in SETTINGS:
        assert "--" + spec.name.replace("_", "-") in out.stdout
        assert spec.envs[0] in out.stdout
    bad = subprocess.run([sys.executable, "-m", "evenflow.clients.cli", "serve", "--max-queue", "none"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert "--max-queue" in bad.stderr and "Traceback" not in bad.stderr


def test_target_itl_defaults_to_auto_and_rejects_words() -> None:
    assert load_settings({}).target_itl_ms is None
    assert load_settings({"EVENFLOW_TARGET_ITL_MS": "auto"}).target_itl_ms is None
    assert load_settings({"EVENFLOW_TARGET_ITL_MS": "0"}).target_itl_ms == 0.0
    with pytest.raises(ConfigError, match="EVENFLOW_TARGET_ITL_MS"):
        load_settings({"EVENFLOW_TARGET_ITL_MS": "fast"})


def test_llamacpp_kv_layout_is_checked_at_start() -> None:
    assert load_settings({}).llamacpp_kv == "auto"
    assert load_settings({"EVENFLOW_LLAMACPP_KV": "unified"}).llamacpp_kv == "unified"
    with pytest.raises(ConfigError, match="EVENFLOW_LLAMACPP_KV"):
        load_settings({"EVENFLOW_LLAMACPP_KV": "sideways"})


def test_flash_attention_takes_ollamas_variable_and_words() -> None:
    assert load_settings({}).flash_attention == "auto"
    assert load_settings({"OLLAMA_FLASH_ATTENTION": "1"}).flash_attention == "on"
    assert load_settings({"EVENFLOW_FLASH_ATTENTION": "off"}).flash_attention == "off"
    assert load_settings({"OLLAMA_FLASH_ATTENTION": "false"}).flash_attention == "off"
    with pytest.raises(ConfigError, match="FLASH_ATTENTION"):
        load_settings({"EVENFLOW_FLASH_ATTENTION": "sometimes"})


def test_kv_cache_type_takes_ollamas_variable() -> None:
    assert load_settings({}).kv_cache_type == "auto"
    assert load_settings({"OLLAMA_KV_CACHE_TYPE": "Q8_0"}).kv_cache_type == "q8_0"
    assert load_settings({"EVENFLOW_KV_CACHE_TYPE": "q4_0"}).kv_cache_type == "q4_0"
    assert load_settings({"OLLAMA_KV_CACHE_TYPE": "f16"}).kv_cache_type == "f16"
    assert load_settings({"OLLAMA_KV_CACHE_TYPE": ""}).kv_cache_type == "auto"
    with pytest.raises(ConfigError, match="KV_CACHE_TYPE"):
        load_settings({"OLLAMA_KV_CACHE_TYPE": "q2_k"})
    from evenflow.backends.base import KV_CACHE_TYPES

    assert [load_settings({"OLLAMA_KV_CACHE_TYPE": t}).kv_cache_type for t in KV_CACHE_TYPES] == list(KV_CACHE_TYPES)
