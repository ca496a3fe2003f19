"""Speculative decoding through HTTP with the official clients: at default settings prompt-lookup drafts are
verified inside the steps, Ollama's eval_count counts the tokens returned, /metrics and /api/events show the drafts;
a draft model named in the Modelfile (DRAFT) loads beside the model; a draft model of another vocabulary is a clear
400 (a draft model named per request: test_speculative_request_draft.py)."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import ollama
import pytest

from api_harness import Daemon, start_daemon, upload_model

pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Daemon:
    d = start_daemon(tmp_path_factory.mktemp("spec-http"), backend="llamacpp")
    # tied embeddings: the random model mostly repeats its last token, so drafts from its own output are kept
    upload_model(d.url, Path(synthetic_model("tiny", "llama", formats=("gguf",), qk_std=0.3,
                                             tie_word_embeddings=True)["gguf"]), "echo")
    upload_model(d.url, Path(synthetic_model("tiny", "llama", formats=("gguf",), qk_std=0.3)["gguf"]), "plain")
    upload_model(d.url, Path(synthetic_model("tiny", "llama", formats=("gguf",), qk_std=0.3, seed=1,
                                             num_hidden_layers=1)["gguf"]), "small")
    upload_model(d.url, Path(synthetic_model("tiny", "llama", formats=("gguf",), vocab_size=1024)["gguf"]),
                 "other-vocab")
    yield d
    d.stop()


def create(url: str, name: str, base: str, **params: object) -> httpx.Response:
    return httpx.post(url + "/api/create", json={"model": name, "from": base, "parameters": params,
                                                 "stream": False}, timeout=120)


def test_default_daemon_drafts_and_reports_it(daemon: Daemon) -> None:
    events: list[dict] = []
    subscribed, done = threading.Event(), threading.Event()

    def follow() -> None:
        """Every event up to the fourth request's `finished` (events reach readers in batches, after the replies)."""
        with httpx.stream("GET", daemon.url + "/api/events", timeout=None) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                events.append(json.loads(line))
                subscribed.set()
                if sum(e.get("type") == "request" and e.get("event") == "finished" for e in events) == 4:
                    done.set()
                    return

    threading.Thread(target=follow, daemon=True).start()
    assert subscribed.wait(60)  # the hello: the hub publishes to this reader from now on
    client = ollama.Client(host=daemon.url, timeout=120)
    off = client.generate(model="echo", prompt="Say it again and again:", raw=True,
                          options={"temperature": 0, "num_predict": 48, "draft_num_predict": 0})
    on = client.generate(model="echo", prompt="Say it again and again:", raw=True,
                         options={"temperature": 0, "num_predict": 48})
    streamed = list(client.generate(model="echo", prompt="Say it again and again:", raw=True, stream=True,
                                    options={"temperature": 0, "num_predict": 48}))
    client.generate(model="echo", prompt="x", raw=True, options={"num_predict": 1, "draft_num_predict": 0})
    assert done.wait(60)
    assert on.response == off.response == "".join(p.response for p in streamed)
    assert on.eval_count == off.eval_count == 48  # the tokens returned, not the drafts verified
    engine = daemon.ctx.manager.models["echo:latest"].engine
    st = engine.stats()
    assert st.accepted_tokens > 0 and st.tokens_per_forward > 1.0
    steps = [e for e in events if e.get("type") == "step" and e.get("model") == "echo:latest"]
    assert sum(e["draft_tokens"] for e in steps) == st.draft_tokens
    assert sum(e["accepted_tokens"] for e in steps) == st.accepted_tokens
    finished = [e for e in events if e.get("type") == "request" and e.get("event") == "finished"]
    assert sum(e["accepted_tokens"] for e in finished) == st.accepted_tokens
    metrics = httpx.get(daemon.url + "/metrics").text
    assert f'evenflow_speculative_accepted_tokens_total{{model="echo:latest"}} {float(st.accepted_tokens)}' in metrics
    line = next(ln for ln in metrics.splitlines() if ln.startswith('evenflow_tokens_per_forward{model="echo:latest"}'))
    assert float(line.split()[-1]) == pytest.approx(st.tokens_per_forward)


def test_a_draft_model_named_in_the_modelfile(daemon: Daemon) -> None:
    from evenflow.daemon.store.modelfile import parse_modelfile

    assert parse_modelfile("FROM plain\nDRAFT small\n").parameters == {"draft_model": "small"}
    r = create(daemon.url, "plain-drafted", "plain", draft_model="small")
    assert r.status_code == 200, r.text
    client = ollama.Client(host=daemon.url, timeout=120)
    want = client.generate(model="plain", prompt="Once upon a time", raw=True,
                           options={"temperature": 0, "num_predict": 40})
    got = client.generate(model="plain-drafted", prompt="Once upon a time", raw=True,
                          options={"temperature": 0, "num_predict": 40, "draft_num_predict": 4})
    assert got.response == want.response and got.eval_count == want.eval_count
    loaded = daemon.ctx.manager.models["plain-drafted:latest"]
    assert loaded.draft is not None and loaded.engine.stats().draft_tokens > 0
    assert "draft_model" in client.show("plain-drafted").parameters


def test_bad_draft_models_are_clear_errors(daemon: Daemon) -> None:
    assert create(daemon.url, "mismatched", "plain", draft_model="other-vocab").status_code == 200
    r = httpx.post(daemon.url + "/api/generate", json={"model": "mismatched", "prompt": "hi", "stream": False},
                   timeout=120)
    assert r.status_code == 400 and "has 1024 tokens" in r.json()["error"], r.text
    assert create(daemon.url, "missing-draft", "plain", draft_model="nowhere").status_code == 200
    r = httpx.post(daemon.url + "/api/generate", json={"model": "missing-draft", "prompt": "hi", "stream": False},
                   timeout=120)
    assert r.status_code == 400 and "nowhere" in r.json()["error"], r.text
    r = httpx.post(daemon.url + "/api/generate", json={"model": "plain", "prompt": "hi", "stream": False,
                                                       "options": {"draft_num_predict": -5}}, timeout=120)
    assert r.status_code == 400 and "draft_num_predict" in r.json()["error"], r.text
