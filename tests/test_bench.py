"""`evenflow bench`: metric arithmetic on synthetic timelines, stream parsing, target safety, and a real run."""
from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path

import pytest

from evenflow.clients.bench import run_poisson, run_stall
from evenflow.clients.bench_cli import main as bench_main
from evenflow.clients.bench_http import TargetError, build_request, check_target, make_prompt, parse_line
from evenflow.clients.bench_metrics import (RequestRecord, meets_slo, parse_slo, percentile, stall_windows,
                                            stats_ms, summarize)

REPO = Path(__file__).resolve().parents[1]


def rec(rid: int, start: float, times: list[float], end: float | None = None, n_out: int | None = None,
        ok: bool = True, stopped: bool = False, kind: str = "request") -> RequestRecord:
    r = RequestRecord(rid=rid, kind=kind, prompt_len_target=10, output_len=len(times), start=start,
                      token_times=list(times), end=end, server_output_tokens=n_out, ok=ok, stopped=stopped,
                      prompt_tokens=10)
    return r


# ---- metrics -------------------------------------------------------------------------------------------------------

def test_percentile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(xs, 99) == pytest.approx(3.97)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    s = stats_ms([0.001, 0.002, 0.003, 0.004])
    assert s["count"] == 4 and s["mean"] == pytest.approx(2.5) and s["p90"] == pytest.approx(3.7)
    assert s["max"] == pytest.approx(4.0)
    assert stats_ms([])["p99"] is None


def test_request_ttft_itl_tpot_e2el():
    r = rec(0, 1.0, [1.1, 1.15, 1.25, 1.3], end=1.32, n_out=4)
    assert r.ttft == pytest.approx(0.1)
    assert r.itls == pytest.approx([0.05, 0.1, 0.05])
    assert r.e2el == pytest.approx(0.32)
    assert r.tpot == pytest.approx((0.32 - 0.1) / 3)
    assert r.max_itl == pytest.approx(0.1)
    # A stream the bench stopped: no E2EL, TPOT up to its last chunk, token count = chunks.
    s = rec(1, 0.0, [0.2, 0.3, 0.5], ok=False, stopped=True)
    assert s.e2el is None and s.output_tokens == 3 and s.tpot == pytest.approx(0.15)
    assert rec(2, 0.0, [0.2], end=0.25, n_out=1).tpot is None


def test_summarize_pools_itl_and_counts_goodput():
    a = rec(0, 0.0, [0.1, 0.2, 0.3], end=0.3, n_out=3)          # gaps 100, 100 ms
    b = rec(1, 0.5, [1.0, 1.4], end=1.5, n_out=2)               # ttft 500 ms, gap 400 ms
    c = rec(2, 0.0, [], ok=False)
    c.error = "HTTP 500"
    s = summarize([a, b, c], duration_s=2.0, slo={"ttft": 200, "itl": 150})
    assert (s["requests"], s["completed"], s["failed"], s["stopped"]) == (3, 2, 1, 0)
    assert s["itl_ms"]["count"] == 3
    assert s["itl_ms"]["mean"] == pytest.approx(200.0)
    assert s["itl_ms"]["p50"] == pytest.approx(100.0) and s["itl_ms"]["max"] == pytest.approx(400.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(((0.3 - 0.1) / 2 * 1000 + (1.0 - 0.5) * 1000) / 2)
    assert s["e2el_ms"]["max"] == pytest.approx(1000.0)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.5)
    assert s["total_input_tokens"] == 20
    assert s["good_requests"] == 1 and s["goodput"] == pytest.approx(0.5)  # b fails both ttft and itl
    assert meets_slo(b, {"ttft": 600, "itl": 500}) and not meets_slo(b, {"e2el": 900})
    assert not meets_slo(c, {"ttft": 1e9})


def test_parse_slo():
    assert parse_slo("ttft=500, itl=150") == {"ttft": 500.0, "itl": 150.0}
    assert parse_slo(None) == {}
    for bad in ("ttft", "foo=1", "ttft=abc", "itl=-3"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_stall_windows_split_gaps_and_catch_the_straddling_stall():
    # Stream decodes every 10 ms, stalls from 0.50 to 0.90 around a long prompt sent at 0.505 (first token 0.88).
    times = [0.40, 0.41, 0.42, 0.43, 0.44, 0.45, 0.46, 0.47, 0.48, 0.49, 0.50, 0.90, 0.91, 0.92, 1.00]
    s0 = rec(0, 0.0, times, ok=False, stopped=True, kind="stream")
    s1 = rec(1, 0.0, [0.45, 0.47, 0.49, 0.70, 0.95], ok=False, stopped=True, kind="stream")
    w = stall_windows([s0, s1], before_start=0.40, long_send=0.505, long_first_token=0.88, after_end=1.0)
    assert w["before_ms"]["count"] == 10 + 2
    assert w["before_ms"]["p50"] == pytest.approx(10.0)
    assert w["before_ms"]["max"] == pytest.approx(20.0)
    # s0's 0.50->0.90 gap starts before the send but overlaps the prefill window: it is THE stall.
    assert w["during_ms"]["count"] == 3
    assert w["during_ms"]["max"] == pytest.approx(400.0)
    assert w["during_ms"]["mean"] == pytest.approx((400 + 210 + 250) / 3)
    assert w["after_ms"]["count"] == 3 and w["after_ms"]["max"] == pytest.approx(80.0)
    assert w["ingest_ms"] == pytest.approx(375.0)
    assert w["stall_ratio"] == pytest.approx(40.0)
    assert w["streams_through_window"] == 2
    with pytest.raises(ValueError):
        stall_windows([s0], 0.6, 0.5, 0.9, 1.0)


# ---- protocols -----------------------------------------------------------------------------------------------------

def test_parse_lines_of_each_protocol():
    c = parse_line("ollama-generate", '{"model":"m","response":"Hi","done":false}')
    assert c.text == "Hi" and not c.final
    c = parse_line("ollama-generate", '{"model":"m","response":"","done":true,"done_reason":"length",'
                   '"prompt_eval_count":12,"eval_count":5}')
    assert c.final and c.text == "" and (c.prompt_tokens, c.output_tokens, c.done_reason) == (12, 5, "length")
    c = parse_line("ollama-chat", '{"message":{"role":"assistant","content":"yo"},"done":false}')
    assert c.text == "yo"
    assert parse_line("ollama-chat", '{"error":"model not found"}').error == "model not found"
    c = parse_line("openai-completions", 'data: {"choices":[{"text":"ab","index":0,"finish_reason":null}]}')
    assert c.text == "ab" and not c.final
    c = parse_line("openai-completions", 'data: {"choices":[{"text":"","finish_reason":"length"}],'
                   '"usage":{"completion_tokens":5,"prompt_tokens":122,"prompt_tokens_details":{"cached_tokens":3}}}')
    assert c.text == "" and (c.prompt_tokens, c.output_tokens, c.cached_tokens, c.done_reason) == (122, 5, 3, "length")
    c = parse_line("openai-completions", 'data: {"choices":[{"text":"ab","finish_reason":null}],'
                   '"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}')
    assert c.prompt_tokens is None and c.output_tokens is None  # Ollama's zero usage on every chunk is no count
    c = parse_line("openai-chat", 'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}')
    assert c.text == ""  # the role-only first chunk is not a token
    assert parse_line("openai-chat", 'data: {"choices":[{"delta":{"content":" x"}}]}').text == " x"
    assert parse_line("openai-chat", "data: [DONE]").final
    assert parse_line("openai-chat", ": ping") is None and parse_line("openai-chat", "") is None


def test_request_bodies_ask_for_fixed_output_at_temperature_zero():
    path, body = build_request("ollama-generate", "m", "p", 7, 3, True)
    assert path == "/api/generate" and body["options"]["num_predict"] == 7 and body["options"]["temperature"] == 0
    path, body = build_request("openai-chat", "m", "p", 7, 3, False)
    assert path == "/v1/chat/completions" and body["max_tokens"] == 7 and "ignore_eos" not in body
    assert body["messages"] == [{"role": "user", "content": "p"}]
    assert build_request("openai-completions", "m", "p", 7, 3)[1]["ignore_eos"] is True  # auto: on for OpenAI
    assert "ignore_eos" not in build_request("ollama-chat", "m", "p", 7, 3)[1]["options"]  # auto: off for Ollama
    assert build_request("ollama-chat", "m", "p", 7, 3, True)[1]["options"]["ignore_eos"] is True
    a, b = make_prompt(50, seed=1), make_prompt(50, seed=1)
    assert a != b and a.split(": ", 1)[1] == b.split(": ", 1)[1]  # unique nonce, same seeded words
    assert make_prompt(60, seed=1).split(": ", 1)[1].startswith(a.split(": ", 1)[1])  # prefix-stable


# ---- safety --------------------------------------------------------------------------------------------------------

def test_non_loopback_targets_are_refused_without_allow_remote():
    for ok in ("http://127.0.0.1:11434", "localhost:8080", "http://[::1]:80/", "http://127.3.2.1:1"):
        assert check_target(ok).startswith("http")
    for bad in ("http://10.0.0.5:11434", "http://example.com", "192.0.2.1:11434", "http://[2001:db8::1]:80"):
        with pytest.raises(TargetError):
            check_target(bad)
    assert check_target("http://10.0.0.5:11434", allow_remote=True) == "http://10.0.0.5:11434"
    with pytest.raises(TargetError):
        asyncio.run(run_stall("http://192.0.2.1:11434", "openai-completions", "m"))
    # The CLI refuses before any connection: 192.0.2.0/24 is unroutable, so an attempt would hang, not fail.
    assert bench_main(["stall", "--url", "http://192.0.2.1:11434", "-q"]) == 2


def test_bounds_are_enforced():
    with pytest.raises(ValueError, match="duration"):
        asyncio.run(run_stall("http://127.0.0.1:9", duration=10_000))
    with pytest.raises(ValueError, match="max_requests"):
        asyncio.run(run_stall("http://127.0.0.1:9", n_streams=8, max_requests=10))
    with pytest.raises(ValueError, match="max_requests"):
        asyncio.run(run_poisson("http://127.0.0.1:9", num_requests=20_000, max_requests=20_000))


# ---- end to end against a real llama-server ------------------------------------------------------------------------

def _load_llama_server_helper():
    spec = importlib.util.spec_from_file_location("bench_llama_server", REPO / "docs" / "bench" / "llama_server.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def llama_server_url(synthetic_model):
    pytest.importorskip("xllamacpp", reason="xllamacpp (prebuilt llama-server wheel) is not installed")
    gguf = synthetic_model("tiny", "llama", formats=("gguf",), gguf_dtype="f32")["gguf"]
    helper = _load_llama_server_helper()
    try:
        cm = helper.llama_server(gguf, n_batch=512, n_ubatch=512, slots=3, ctx_per_slot=2048, threads=1,
                                 verbosity=0)
        url = cm.__enter__()
    except Exception as e:  # noqa: BLE001 - any start failure is a skip, with its reason
        pytest.skip(f"llama-server from xllamacpp could not start: {type(e).__name__}: {e}")
    yield url
    cm.__exit__(None, None, None)


def test_stall_end_to_end_against_llama_server(llama_server_url, tmp_path):
    js, png = tmp_path / "stall.json", tmp_path / "stall.png"
    rc = bench_main(["stall", "--url", llama_server_url, "--protocol", "openai-completions", "--streams", "2",
                     "--prompt-len", "128", "--output-len", "1500", "--long-output-len", "4", "--warmup", "0.3",
                     "--tail", "1.0", "--stream-prompt-len", "24", "--duration", "60", "--slo", "ttft=60000",
                     "--json", str(js), "--png", str(png), "-q"])
    assert rc == 0
    d = json.loads(js.read_text())
    assert d["scenario"] == "stall" and not d["truncated"]
    reqs = d["requests"]
    assert [r["kind"] for r in reqs] == ["stream", "stream", "long"]
    assert all(r["error"] is None for r in reqs)
    long = reqs[-1]
    assert long["ok"] and long["output_tokens"] == 4 and long["done_reason"] == "length"
    assert abs(long["prompt_tokens"] - 128) <= 0.05 * 128, d["calibration"]
    for r in reqs[:2]:
        assert r["stopped"] and len(r["token_times"]) >= 3
        assert r["token_times"] == sorted(r["token_times"]) and r["token_times"][0] > r["start"]
    st = d["stall"]
    w = st["windows"]
    assert w["before_s"][0] <= w["before_s"][1] == w["during_s"][0] < w["during_s"][1] == w["after_s"][0]
    assert st["long_ttft_ms"] > 0 and w["before_ms"]["count"] > 0 and w["during_ms"]["count"] > 0
    assert w["streams_through_window"] == 2
    s = d["summary"]
    assert s["completed"] == 1 and s["stopped"] == 2 and s["failed"] == 0
    assert s["itl_ms"]["count"] == sum(len(r["token_times"]) - 1 for r in reqs)
    assert s["good_requests"] == 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_poisson_end_to_end_against_llama_server(llama_server_url):
    res = asyncio.run(run_poisson(llama_server_url, "openai-chat", None, rate=20.0, num_requests=4,
                                  prompt_len="16:48", output_len="6", max_concurrency=2, duration=60, seed=3,
                                  slo={"e2el": 60_000}))
    s = res.summary
    assert s["completed"] == 4 and s["failed"] == 0 and not res.truncated
    assert all(r.output_tokens == 6 and r.prompt_tokens and r.e2el for r in res.records)
    assert s["total_output_tokens"] == 24 and s["good_requests"] == 4
    assert s["itl_ms"]["count"] == sum(len(r.token_times) - 1 for r in res.records)
    starts = [r.start for r in res.records]
    assert starts == sorted(starts)


def test_allow_remote_never_applies_to_an_address_from_the_environment(monkeypatch):
    monkeypatch.setenv("EVENFLOW_HOST", "192.0.2.7:11434")
    assert bench_main(["stall", "--allow-remote", "-q"]) == 2


@pytest.mark.parametrize("protocol", ["ollama-generate", "openai-chat"])
def test_stall_end_to_end_against_evenflow(protocol, tmp_path, synthetic_model):
    """The same stall run against evenflow's own daemon (llama.cpp if installed, else torch), on two protocols."""
    from api_harness import BACKENDS, start_daemon, upload_model

    gguf = Path(synthetic_model("tiny", formats=("gguf",), text_only_output=True)["gguf"])
    d = start_daemon(tmp_path, backend="llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0],
                     context_length="2048", target_itl_ms="0", max_batched_tokens="32")
    try:
        upload_model(d.url, gguf, "tiny")
        js = tmp_path / "stall.json"
        rc = bench_main(["stall", "--url", d.url, "--protocol", protocol, "--model", "tiny", "--streams", "2",
                         "--prompt-len", "256", "--output-len", "1500", "--long-output-len", "4", "--warmup", "0.3",
                         "--tail", "1.0", "--stream-prompt-len", "24", "--duration", "60", "--json", str(js), "-q"])
        assert rc == 0
        out = json.loads(js.read_text())
        reqs = out["requests"]
        assert all(r["error"] is None for r in reqs), [r["error"] for r in reqs]
        long = reqs[-1]
        assert long["kind"] == "long" and long["ok"] and long["output_tokens"] == 4
        assert abs(long["prompt_tokens"] - 256) <= 0.05 * 256
        w = out["stall"]["windows"]
        # a 32-token budget: the streams keep getting tokens while the 256-token prompt goes in
        assert w["streams_through_window"] == 2 and w["during_ms"]["count"] >= 2 * 4
    finally:
        d.stop()
