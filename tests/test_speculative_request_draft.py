"""A draft model named per request (`options.draft_model`, /v1's `draft_model` through the openai client's
extra_body) through HTTP: it loads beside the model (its memory counted in `ps`), greedy output is the same as
without it, requests with different draft models and none run at once, and bad names are clear errors."""
from __future__ import annotations

import concurrent.futures
import hashlib
from pathlib import Path

import httpx
import ollama
import openai
import pytest

from api_harness import Daemon, start_daemon, upload_model

pytest.importorskip("llama_cpp")

PROMPTS = ["Once upon a time", "The list of items: apples, pears, apples, pears,", "Repeat after me: one two"]


def upload_folder(url: str, folder: Path, name: str) -> None:
    """Create `name` from an HF folder's files (the files form of /api/create): a safetensors model."""
    files = {}
    with httpx.Client(base_url=url, timeout=120) as c:
        for f in sorted(p for p in folder.iterdir() if p.is_file()):
            data = f.read_bytes()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            assert c.post(f"/api/blobs/{digest}", content=data).status_code in (200, 201)
            files[f.name] = digest
        r = c.post("/api/create", json={"model": name, "files": files, "stream": False})
        assert r.status_code == 200, r.text


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Daemon:
    # the default backend choice: GGUF models run on llama.cpp, the safetensors one on torch
    d = start_daemon(tmp_path_factory.mktemp("spec-req"))
    tiny = lambda **kw: Path(synthetic_model("tiny", "llama", formats=("gguf",), qk_std=0.3, **kw)["gguf"])  # noqa
    upload_model(d.url, tiny(), "plain")
    upload_model(d.url, tiny(), "twin")  # the same weights: its drafts are the model's own greedy tokens
    upload_model(d.url, tiny(seed=1, num_hidden_layers=1), "small")
    upload_model(d.url, tiny(seed=2, num_hidden_layers=1), "small2")
    upload_model(d.url, Path(synthetic_model("tiny", "llama", formats=("gguf",), vocab_size=1024)["gguf"]),
                 "other-vocab")
    yield d
    d.stop()


def greedy(client: ollama.Client, prompt: str, **options: object) -> ollama.GenerateResponse:
    return client.generate(model="plain", prompt=prompt, raw=True,
                           options={"temperature": 0, "num_predict": 40, **options})


def test_a_request_drafts_with_the_model_it_names(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url, timeout=120)
    want = greedy(client, PROMPTS[0])
    size = next(m.size for m in client.ps().models if m.model == "plain:latest")
    events: list[dict] = []
    daemon.ctx.manager.add_listener(lambda e: events.append(e) if e.get("type") == "model" else None)
    got = greedy(client, PROMPTS[0], draft_model="small", draft_num_predict=4)
    assert got.response == want.response and got.eval_count == want.eval_count == 40
    loaded = daemon.ctx.manager.models["plain:latest"]
    assert set(loaded.drafts) == {"small:latest"} and loaded.draft is None
    st = loaded.engine.stats()
    # the draft model's tokens were verified (prompt lookup proposed none), and counted
    assert loaded.engine.spec.drafted_by("small:latest") == st.draft_tokens > 0
    grown = next(m.size for m in client.ps().models if m.model == "plain:latest")
    assert grown > size  # its memory counts
    # /api/events said so (the monitor's size follows it)
    assert [(e["event"], e["model"], e["draft"], e["size"]) for e in events] == [
        ("draft_loaded", "plain:latest", "small:latest", grown)] and events[0]["load_ms"] > 0
    metrics = httpx.get(daemon.url + "/metrics").text
    assert f'evenflow_speculative_draft_tokens_total{{model="plain:latest"}} {float(st.draft_tokens)}' in metrics
    # /v1 names it in the body (the openai client's extra_body)
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", timeout=120)
    plain = oai.completions.create(model="plain", prompt=PROMPTS[1], max_tokens=30, temperature=0)
    drafted = oai.completions.create(model="plain", prompt=PROMPTS[1], max_tokens=30, temperature=0,
                                     extra_body={"draft_model": "twin", "draft_num_predict": 3})
    assert drafted.choices[0].text == plain.choices[0].text
    assert drafted.usage.completion_tokens == plain.usage.completion_tokens
    assert loaded.engine.spec.drafted_by("twin:latest") > 0 and loaded.engine.stats().accepted_tokens > 0
    again = oai.completions.create(model="plain", prompt=PROMPTS[1], max_tokens=30, temperature=0,
                                   extra_body={"draft_model": "small"})  # the loaded one, by its short name
    assert again.choices[0].text == plain.choices[0].text
    assert daemon.ctx.manager.models["plain:latest"] is loaded
    assert set(loaded.drafts) == {"small:latest", "twin:latest"}


def test_concurrent_requests_with_different_drafts_and_none(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url, timeout=120)
    solo = {p: greedy(client, p, draft_num_predict=0).response for p in PROMPTS}
    jobs = [(p, d) for p in PROMPTS for d in ("small", "small2", None)]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futs = {pool.submit(greedy, client, p, **({"draft_model": d, "draft_num_predict": 3} if d else {})): p
                for p, d in jobs}
        for fut, p in futs.items():
            assert fut.result().response == solo[p]
    loaded = daemon.ctx.manager.models["plain:latest"]
    assert {"small:latest", "small2:latest"} <= set(loaded.drafts)
    assert loaded.engine.spec.drafted_by("small2:latest") > 0


def test_bad_draft_models_per_request_are_clear_errors(daemon: Daemon, synthetic_model) -> None:
    def post(model: str, draft: object) -> httpx.Response:
        return httpx.post(daemon.url + "/api/generate", timeout=120, json={
            "model": model, "prompt": "hi", "stream": False, "options": {"num_predict": 2, "draft_model": draft}})

    r = post("plain", "nowhere")
    assert r.status_code == 404 and "draft model 'nowhere' not found" in r.json()["error"], r.text
    r = post("plain", "other-vocab")
    assert r.status_code == 400 and "has 1024 tokens" in r.json()["error"], r.text
    r = post("plain", 5)
    assert r.status_code == 400 and "draft_model" in r.json()["error"], r.text
    oai = openai.OpenAI(base_url=daemon.url + "/v1", api_key="x", timeout=120)
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="plain", prompt="hi", max_tokens=2, extra_body={"draft_model": "nowhere"})
    upload_folder(daemon.url, Path(synthetic_model("tiny", "llama", formats=("hf",), seed=3)["hf"]), "st")
    r = post("plain", "st")
    assert r.status_code == 400 and "must be a GGUF file" in r.json()["error"], r.text
    r = post("st", "small")  # the model runs on torch here
    assert r.status_code == 400 and "llama.cpp backend only" in r.json()["error"], r.text
    # nothing was lost: the model still serves, with and without its loaded draft model
    client = ollama.Client(host=daemon.url, timeout=120)
    assert greedy(client, PROMPTS[2], draft_model="small").response == greedy(client, PROMPTS[2]).response
    assert "other-vocab:latest" not in daemon.ctx.manager.models["plain:latest"].drafts


def test_the_drafts_unload_with_the_model(daemon: Daemon) -> None:
    client = ollama.Client(host=daemon.url, timeout=120)
    greedy(client, PROMPTS[0], draft_model="small")
    loaded = daemon.ctx.manager.models["plain:latest"]
    drafts = list(loaded.drafts.values())
    assert drafts
    client.generate(model="plain", prompt="", keep_alive=0)  # Ollama's unload
    assert "plain:latest" not in daemon.ctx.manager.models
    assert all(r.llama_context is None for r in drafts)  # closed


def test_a_modelfile_draft_stays_the_default_beside_requested_ones(daemon: Daemon) -> None:
    r = httpx.post(daemon.url + "/api/create", json={"model": "plain-drafted", "from": "plain",
                                                     "parameters": {"draft_model": "small"}, "stream": False},
                   timeout=120)
    assert r.status_code == 200, r.text
    client = ollama.Client(host=daemon.url, timeout=120)
    want = greedy(client, PROMPTS[1], draft_num_predict=0).response

    def drafted(**options: object) -> str:
        return client.generate(model="plain-drafted", prompt=PROMPTS[1], raw=True, options={
            "temperature": 0, "num_predict": 40, "draft_num_predict": 3, **options}).response

    assert drafted() == drafted(draft_model="small:latest") == drafted(draft_model="small2") == want
    loaded = daemon.ctx.manager.models["plain-drafted:latest"]
    assert loaded.draft is not None and set(loaded.drafts) == {"small2:latest"}  # its own is not loaded twice
    spec = loaded.engine.spec
    assert spec.drafted_by("") > 0 and spec.drafted_by("small2:latest") > 0
