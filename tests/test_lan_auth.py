"""The API key on a real daemon: 401s in both error shapes, the official clients with the key, CORS, the CLI."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import ollama
import openai
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

KEY = "ef-test-key-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {KEY}"}
BACKEND = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, synthetic_model) -> Iterator[Daemon]:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path_factory.mktemp("auth"), backend=BACKEND, api_key=KEY, context_length="512")
    upload_model(d.url, gguf, "tiny", headers=AUTH)
    yield d
    d.stop()


def test_root_stays_open_everything_else_needs_the_key(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url) as c:
        assert c.get("/").text == "Ollama is running" and c.head("/").status_code == 200
        for method, path in (("GET", "/api/tags"), ("GET", "/api/version"), ("GET", "/api/ps"), ("GET", "/metrics"),
                             ("POST", "/api/show"), ("DELETE", "/api/delete"), ("GET", "/api/events"),
                             ("POST", "/", ), ("GET", "/nowhere")):
            r = c.request(method, path)
            assert r.status_code == 401, (method, path, r.status_code)
            assert "requires an API key" in r.json()["error"]
            assert r.headers["www-authenticate"].startswith("Bearer")
        assert c.get("/api/tags", headers={"Authorization": "Bearer " + KEY[:-1] + "X"}).json() == {
            "error": "unauthorized: invalid API key"}
        assert c.get("/api/tags", headers={"Authorization": f"Basic {KEY}"}).status_code == 401
        assert c.get("/api/tags", headers={"Authorization": KEY}).status_code == 401
        assert c.get("/api/tags", headers={"Authorization": f"bearer  {KEY}"}).status_code == 200
        names = [m["name"] for m in c.get("/api/tags", headers=AUTH).json()["models"]]
        assert "tiny:latest" in names


def test_refused_request_loses_nothing(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url) as c:
        r = c.post("/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False})
        assert r.status_code == 401
        r = c.request("DELETE", "/api/delete", json={"model": "tiny"})
        assert r.status_code == 401
        assert c.get("/api/ps", headers=AUTH).json()["models"] == []  # nothing was loaded for it
        assert "tiny:latest" in [m["name"] for m in c.get("/api/tags", headers=AUTH).json()["models"]]


def test_openai_client_shape_and_key(daemon: Daemon) -> None:
    r = httpx.get(daemon.url + "/v1/models")
    err = r.json()["error"]
    assert r.status_code == 401 and err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
    bad = openai.OpenAI(base_url=daemon.url + "/v1", api_key="wrong-key-0123456789", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=daemon.url + "/v1", api_key=KEY, max_retries=0)
    assert "tiny:latest" in [m.id for m in good.models.list()]
    out = good.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert out.usage.completion_tokens <= 3


def test_ollama_client_with_headers(daemon: Daemon) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        ollama.Client(host=daemon.url).list()
    assert e.value.status_code == 401
    c = ollama.Client(host=daemon.url, headers=AUTH)
    parts = list(c.generate(model="tiny", prompt="hello", stream=True, options={"num_predict": 3}))
    assert parts[-1].done and parts[-1].eval_count <= 3


def test_cors_preflight_answered_without_key_and_401_readable(daemon: Daemon) -> None:
    origin = {"Origin": "http://localhost:3000"}
    r = httpx.options(daemon.url + "/api/chat", headers=origin | {"Access-Control-Request-Method": "POST",
                                                                  "Access-Control-Request-Headers": "authorization"})
    assert r.status_code == 204 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "Authorization" in r.headers["access-control-allow-headers"]
    r = httpx.get(daemon.url + "/api/tags", headers=origin)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert httpx.get(daemon.url + "/api/tags", headers=origin | AUTH).status_code == 200


def test_events_hello_says_auth(daemon: Daemon) -> None:
    with httpx.stream("GET", daemon.url + "/api/events", headers=AUTH, timeout=30) as r:
        hello = json.loads(next(r.iter_lines()))
    assert hello["type"] == "hello" and hello["auth"] is True and hello["warnings"] == []


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("EVENFLOW_API_KEY", "OLLAMA_HOST")} | env
    return subprocess.run([sys.executable, "-m", "evenflow.clients.cli", *args], capture_output=True, text=True,
                          env=full, timeout=120)


def test_cli_sends_the_key_from_env_or_key_file(daemon: Daemon, tmp_path: Path) -> None:
    host = {"EVENFLOW_HOST": daemon.url, "EVENFLOW_API_KEY_FILE": str(tmp_path / "none")}
    r = _cli(["list"], host)
    assert r.returncode == 1 and "unauthorized" in r.stderr
    r = _cli(["list"], host | {"EVENFLOW_API_KEY": KEY})
    assert r.returncode == 0 and "tiny:latest" in r.stdout
    key_file = tmp_path / "cfg" / "api_key"
    env = host | {"EVENFLOW_API_KEY_FILE": str(key_file)}
    r = _cli(["key", "new"], env)
    assert r.returncode == 0 and key_file.stat().st_mode & 0o777 == 0o600
    new = r.stdout.strip()
    assert key_file.read_text().strip() == new and len(new) >= 32
    assert _cli(["key", "new"], env).returncode == 1  # never overwritten silently
    assert _cli(["key", "show"], env).stdout.strip() == new
    assert _cli(["list"], env).returncode == 1  # the daemon runs with another key
    key_file.write_text(KEY + "\n")
    r = _cli(["ps"], env)
    assert r.returncode == 0 and r.stdout.startswith("NAME"), r.stderr


def test_bench_client_carries_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from evenflow.clients.bench import _client

    monkeypatch.setenv("EVENFLOW_API_KEY", KEY)
    assert _client("http://127.0.0.1:1", 5.0, 1).headers["authorization"] == f"Bearer {KEY}"
    monkeypatch.delenv("EVENFLOW_API_KEY")
    assert "authorization" not in _client("http://127.0.0.1:1", 5.0, 1).headers


def _raw_status(url: str, header_lines: list[bytes]) -> tuple[int, bytes]:
    """GET /api/tags with these header lines sent byte for byte (clients normalise what this test needs exact)."""
    import socket
    from urllib.parse import urlsplit

    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(b"GET /api/tags HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" + b"".join(
            line + b"\r\n" for line in header_lines) + b"\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_the_bearer_rule(daemon: Daemon) -> None:
    # issue 27: the rule, decided. RFC 6750's grammar: "Bearer" 1*SP token, the scheme case-insensitive; the spaces
    # around a field value are not part of it (RFC 9110 OWS). A second Authorization field is refused.
    k = KEY.encode()
    accepted = [b"Authorization: Bearer " + k, b"Authorization: Bearer  " + k, b"Authorization: Bearer " + k + b" ",
                b"Authorization: BEARER " + k, b"authorization:   Bearer " + k + b"\t"]
    refused = [b"Authorization: Bearer\t" + k, b"Authorization: Bearer " + k + b" extra", b"Authorization: Bearer" + k,
               b"Authorization: Bearer " + k + b"x", b"Authorization: Bearer ", b"Authorization: Token " + k]
    for line in accepted:
        assert _raw_status(daemon.url, [line])[0] == 200, line
    for line in refused:
        assert _raw_status(daemon.url, [line])[0] == 401, line
    good = b"Authorization: Bearer " + k
    for pair in ([good, good], [good, b"Authorization: Bearer wrong-key-0123456789"],
                 [b"Authorization: Bearer wrong-key-0123456789", good]):
        status, body = _raw_status(daemon.url, pair)
        assert status == 401 and b"more than one Authorization header" in body, (pair, body)
