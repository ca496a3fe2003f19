"""/api/pull and /api/push against a registry the test starts on loopback (never a real registry)."""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

import httpx
import ollama
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model
from registry_server import Registry, sha


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry()
    yield reg
    reg.close()


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = start_daemon(tmp_path / "d", backend=BACKENDS[0])
    yield d
    d.stop()


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from evenflow.backends.synthetic import cached_model, make_spec

    return Path(cached_model(make_spec("tiny"), ("gguf",), "f32")["gguf"])


def plain(name: str) -> str:
    """The test registry speaks plain HTTP: a name says so with http://, and only with it does insecure apply."""
    return name if "://" in name else "http://" + name


def pull_lines(url: str, model: str, **extra: Any) -> list[dict[str, Any]]:
    body = {"model": plain(model), "insecure": True, **extra}
    with httpx.stream("POST", url + "/api/pull", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def store_root(d: Daemon) -> Path:
    return Path(d.ctx.store.store.root)


def test_pull_lists_and_generates(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    raw = registry.add_model("library", "tiny", "latest", gguf, params={"temperature": 0})
    name = f"{registry.host}/library/tiny:latest"
    lines = pull_lines(daemon.url, name)
    statuses = [x["status"] for x in lines]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert statuses[-3:-1] == ["verifying sha256 digest", "writing manifest"] or "writing manifest" in statuses
    model_digest = json.loads(raw)["layers"][0]["digest"]
    last = [x for x in lines if x.get("digest") == model_digest][-1]
    assert last["status"] == f"pulling {model_digest[7:19]}" and last["completed"] == last["total"] == gguf.stat().st_size
    c = ollama.Client(host=daemon.url)
    listed = {m.model: m for m in c.list().models}
    assert name in listed and listed[name].digest == hashlib.sha256(raw).hexdigest()  # manifest kept verbatim
    out = c.generate(name, "hello", options={"num_predict": 3})
    assert out.done and out.eval_count == 3
    assert c.show(name).parameters.split() == ["temperature", "0"]
    # a second pull finds every blob and downloads nothing
    before = sum(registry.served.values())
    lines = pull_lines(daemon.url, name)
    assert lines[-1] == {"status": "success"} and sum(registry.served.values()) == before


def test_pull_in_parts_with_range(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    raw = registry.add_model("library", "tiny", "latest", gguf)
    size = gguf.stat().st_size
    daemon.ctx.store.store.downloads.part_size = size // 3 + 1  # three ranged parts
    assert pull_lines(daemon.url, f"{registry.host}/library/tiny")[-1] == {"status": "success"}
    digest = json.loads(raw)["layers"][0]["digest"]
    ranges = sorted(r for m, p, r in registry.log if m == "GET" and p.endswith(digest) and r)
    assert len(ranges) == 3 and registry.served[digest] == size
    assert (store_root(daemon) / "blobs" / f"sha256-{digest[7:]}").read_bytes() == gguf.read_bytes()


def test_interrupted_pull_resumes_and_fetches_only_the_rest(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    raw = registry.add_model("library", "tiny", "latest", gguf)
    digest = json.loads(raw)["layers"][0]["digest"]
    size, cut = gguf.stat().st_size, 100_000
    registry.cut_after[digest] = cut  # the connection drops after 100 kB, then the registry answers 503
    name = f"{registry.host}/library/tiny:latest"
    lines = pull_lines(daemon.url, name)
    assert "error" in lines[-1] and "max retries exceeded" in lines[-1]["error"]
    blobs = store_root(daemon) / "blobs"
    part = json.loads((blobs / f"sha256-{digest[7:]}-partial-0").read_text())
    assert part == {"N": 0, "Offset": 0, "Size": size, "Completed": cut}
    assert name not in [m.model for m in ollama.Client(host=daemon.url).list().models]
    registry.unavailable = False
    served_before = registry.served[digest]
    registry.log.clear()
    assert pull_lines(daemon.url, name)[-1] == {"status": "success"}
    assert [r for m, p, r in registry.log if p.endswith(digest) and r] == [f"bytes={cut}-{size - 1}"]
    assert registry.served[digest] - served_before == size - cut
    assert (blobs / f"sha256-{digest[7:]}").read_bytes() == gguf.read_bytes()
    assert not list(blobs.glob("*-partial*"))


def wait_until(cond: Any, what: str, timeout: float = 60) -> None:
    import time  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def pull_then_leave(url: str, name: str, digest: str) -> None:
    """Start a pull and hang up once the daemon reports the blob `digest` (its download is under way)."""
    with httpx.stream("POST", url + "/api/pull", json={"model": plain(name), "insecure": True}, timeout=120) as r:
        for line in r.iter_lines():
            if line and json.loads(line).get("digest") == digest:
                return


def test_a_pull_its_client_left_stops_and_the_next_resumes(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    raw = registry.add_model("library", "tiny", "latest", gguf)
    digest = json.loads(raw)["layers"][0]["digest"]
    size, name = gguf.stat().st_size, f"{registry.host}/library/tiny:latest"
    downloads = daemon.ctx.store.store.downloads
    registry.gate.clear()  # the blob GET waits at the registry: the download is in flight when the client leaves
    pull_then_leave(daemon.url, name, digest)
    wait_until(lambda: [dl.cancelled.is_set() for dl in downloads.active()] == [True], "the download to be cancelled")
    registry.gate.set()  # bytes flow again: the cancelled download keeps what came and stops
    wait_until(lambda: not downloads.active(), "the download to stop")
    blobs = store_root(daemon) / "blobs"
    part = json.loads((blobs / f"sha256-{digest[7:]}-partial-0").read_text())
    assert 0 < part["Completed"] < size, part
    assert not (blobs / f"sha256-{digest[7:]}").exists()
    assert name not in [m.model for m in ollama.Client(host=daemon.url).list().models]

    # two pullers of one blob: the one that leaves does not stop it for the other
    registry.gate.clear()
    registry.ranged.clear()
    stayer: list[list[dict[str, Any]]] = []
    t = threading.Thread(target=lambda: stayer.append(pull_lines(daemon.url, name)))
    t.start()
    assert registry.ranged.wait(60)
    pull_then_leave(daemon.url, name, digest)
    registry.gate.set()
    t.join(120)
    assert stayer[0][-1] == {"status": "success"}
    assert [r for m, p, r in registry.log if p.endswith(digest) and r][-1] == f"bytes={part['Completed']}-{size - 1}"
    assert (blobs / f"sha256-{digest[7:]}").read_bytes() == gguf.read_bytes()
    assert not list(blobs.glob("*-partial*"))


def test_digest_mismatch_fails_and_leaves_no_manifest(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    raw = registry.add_model("library", "tiny", "latest", gguf)
    digest = json.loads(raw)["layers"][0]["digest"]
    registry.corrupt.add(digest)
    name = f"{registry.host}/library/tiny:latest"
    err = pull_lines(daemon.url, name)[-1]["error"]
    assert err.startswith(f"digest mismatch, file must be downloaded again: want {digest}, got sha256:")
    assert name not in [m.model for m in ollama.Client(host=daemon.url).list().models]
    assert not list((store_root(daemon) / "blobs").glob(f"sha256-{digest[7:]}*"))
    r = httpx.post(daemon.url + "/api/pull", json={"model": plain(name), "insecure": True, "stream": False}, timeout=60)
    assert r.status_code == 500 and r.json()["error"].startswith("digest mismatch")


def test_missing_model_offline_and_bad_names(daemon: Daemon, registry: Registry) -> None:
    lines = pull_lines(daemon.url, f"{registry.host}/library/nope:latest")
    assert lines == [{"status": "pulling manifest"}, {"error": "pull model manifest: file does not exist"}]
    with pytest.raises(ollama.ResponseError, match="file does not exist"):
        ollama.Client(host=daemon.url).pull(f"http://{registry.host}/library/nope", insecure=True)
    registry.close()  # nothing listens there any more
    err = pull_lines(daemon.url, f"{registry.host}/library/tiny")[-1]["error"]
    assert "cannot reach the registry at " + registry.host in err
    r = httpx.post(daemon.url + "/api/pull", json={"model": "bad/../name"}, timeout=30)
    assert r.status_code == 400 and "invalid model name" in r.json()["error"]
    r = httpx.post(daemon.url + "/api/pull", json={}, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == "model is required"


def test_redirect_to_a_cdn_is_followed(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    cdn = Registry()
    try:
        raw = registry.add_model("library", "tiny", "latest", gguf)
        cdn.blobs.update(registry.blobs)
        registry.cdn = cdn
        assert pull_lines(daemon.url, f"{registry.host}/library/tiny")[-1] == {"status": "success"}
        digest = json.loads(raw)["layers"][0]["digest"]
        assert cdn.served[digest] == gguf.stat().st_size and registry.served[digest] == 0
        assert any(p == f"/cdn/{digest}" and r for m, p, r in cdn.log)
    finally:
        cdn.close()


def test_concurrent_pulls_share_one_download(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    raw = registry.add_model("library", "tiny", "latest", gguf)
    model_digest = json.loads(raw)["layers"][0]["digest"]
    registry.gate.clear()  # ranged GETs wait until both pulls are under way
    name = f"{registry.host}/library/tiny:latest"
    results: list[list[dict[str, Any]]] = []
    first = threading.Thread(target=lambda: results.append(pull_lines(daemon.url, name)))
    first.start()
    assert registry.ranged.wait(60)
    with httpx.stream("POST", daemon.url + "/api/pull", json={"model": plain(name), "insecure": True}, timeout=120) as r:
        lines = r.iter_lines()
        second = []
        for line in lines:  # the second pull is waiting on the first one's download of the model blob
            second.append(json.loads(line))
            if second[-1].get("digest") == model_digest:
                break
        registry.gate.set()
        second += [json.loads(x) for x in lines if x]
    first.join(60)
    assert results[0][-1] == {"status": "success"} and second[-1] == {"status": "success"}
    assert all(n == 1 for n in registry.ranged_gets.values()), registry.ranged_gets
    assert registry.served[model_digest] == gguf.stat().st_size
    assert daemon.ctx.store.store.downloads.started == 2  # model + config, each once


def test_repull_prunes_unused_layers(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    old = registry.add_model("library", "tiny", "latest", gguf, params={"temperature": 0.5})
    name = f"{registry.host}/library/tiny:latest"
    assert pull_lines(daemon.url, name)[-1] == {"status": "success"}
    old_params = json.loads(old)["layers"][1]["digest"]
    blobs = store_root(daemon) / "blobs"
    assert (blobs / f"sha256-{old_params[7:]}").is_file()
    registry.add_model("library", "tiny", "latest", gguf, params={"temperature": 0.1})
    statuses = [x["status"] for x in pull_lines(daemon.url, name)]
    assert statuses[-2:] == ["removing unused layers", "success"]
    assert not (blobs / f"sha256-{old_params[7:]}").exists()


def test_push_then_pull_round_trips(tmp_path: Path, daemon: Daemon, registry: Registry, gguf: Path) -> None:
    upload_model(daemon.url, gguf, "mine")
    name = f"{registry.host}/me/mine:v1"
    r = httpx.post(daemon.url + "/api/copy", json={"source": "mine", "destination": name}, timeout=30)
    assert r.status_code == 200
    with httpx.stream("POST", daemon.url + "/api/push", json={"model": plain(name), "insecure": True}, timeout=120) as r:
        lines = [json.loads(x) for x in r.iter_lines() if x]
    statuses = [x["status"] for x in lines]
    assert statuses[0] == "retrieving manifest" and statuses[-2:] == ["pushing manifest", "success"], lines
    local = (store_root(daemon) / "manifests" / registry.host / "me" / "mine" / "v1").read_bytes()
    assert registry.manifests[("me", "mine", "v1")] == local
    assert registry.blobs[sha(gguf.read_bytes())] == gguf.read_bytes()
    # pushing again finds every blob on the registry (HEAD) and uploads nothing
    posts = sum(1 for m, p, _ in registry.log if m == "POST")
    with httpx.stream("POST", daemon.url + "/api/push", json={"model": plain(name), "insecure": True}, timeout=120) as r:
        assert json.loads(list(r.iter_lines())[-1]) == {"status": "success"}
    assert sum(1 for m, p, _ in registry.log if m == "POST") == posts
    other = start_daemon(tmp_path / "other", backend=BACKENDS[0])
    try:
        assert pull_lines(other.url, name)[-1] == {"status": "success"}
        c = ollama.Client(host=other.url)
        assert {m.model: m.digest for m in c.list().models}[name] == hashlib.sha256(local).hexdigest()
        assert c.generate(name, "hi", options={"num_predict": 2}).eval_count == 2
    finally:
        other.stop()
    r = httpx.post(daemon.url + "/api/push", json={"model": "nothere"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"] == "model 'nothere:latest' not found"


def test_insecure_never_turns_https_into_http(daemon: Daemon, registry: Registry, gguf: Path) -> None:
    # issue 27: `insecure: true` (Open WebUI sends it on every pull) made every registry request plain HTTP, the
    # public registry's too. A name without http:// stays https: the plain-HTTP test registry never sees a request.
    from evenflow.daemon.store.registry import registry_scheme

    registry.add_model("library", "tiny", "latest", gguf)
    before = len(registry.log)
    r = httpx.post(daemon.url + "/api/pull", json={"model": f"{registry.host}/library/tiny", "insecure": True,
                                                   "stream": False}, timeout=60)
    assert r.status_code == 500 and "cannot reach the registry" in r.json()["error"], r.text
    assert f"http://{registry.host}/..." in r.json()["error"]  # says how to name a plain-HTTP registry
    assert len(registry.log) == before  # no HTTP request arrived: the daemon spoke TLS
    assert registry_scheme("llama3.2", True) == registry_scheme("registry.ollama.ai/library/x", True) == "https"
    # an http:// name needs insecure (Ollama's "insecure protocol http"), before any connection
    r = httpx.post(daemon.url + "/api/pull", json={"model": f"http://{registry.host}/library/tiny", "stream": False},
                   timeout=60)
    assert r.status_code == 400 and "insecure protocol http" in r.json()["error"], r.text
    r = httpx.post(daemon.url + "/api/push", json={"model": f"http://{registry.host}/library/tiny"}, timeout=60)
    assert r.status_code == 400 and "insecure protocol http" in r.json()["error"], r.text
    assert len(registry.log) == before
    assert pull_lines(daemon.url, f"{registry.host}/library/tiny")[-1] == {"status": "success"}  # http:// + insecure
