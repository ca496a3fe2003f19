"""Issue 14: one request never freezes the daemon (its CPU work runs in the worker pool), request bodies have a
limit, a 500 leaves the connection usable, and start-up prunes blobs that interrupted creates left behind."""
from __future__ import annotations

import hashlib
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from api_harness import BACKENDS, Daemon, start_daemon, upload_model

from evenflow.daemon.api.http.errors import INTERNAL_ERROR


def _http_exchange(sock: socket.socket, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on `sock` and read one response (Content-Length framed)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    return status, body


@pytest.fixture(scope="module")
def small_limit(tmp_path_factory) -> Daemon:
    d = start_daemon(tmp_path_factory.mktemp("limits"), max_body_mb="1")
    yield d
    d.stop()


def test_body_over_the_limit_is_413(small_limit: Daemon) -> None:
    big = json.dumps({"model": "tiny", "prompt": "x" * (2 * 2**20)}).encode()
    r = httpx.post(small_limit.url + "/api/generate", content=big, timeout=60)
    assert r.status_code == 413 and "request body too large" in r.json()["error"]
    assert "EVENFLOW_MAX_BODY_MB" in r.json()["error"]
    r = httpx.post(small_limit.url + "/v1/completions", content=big, timeout=60)
    assert r.status_code == 413 and "too large" in r.json()["error"]["message"]  # OpenAI shape under /v1

    def chunks():  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 65536):
            yield big[i:i + 65536]

    r = httpx.post(small_limit.url + "/api/chat", content=chunks(), timeout=60)
    assert r.status_code == 413 and "too large" in r.json()["error"]
    blob = b"\0" * (2 * 2**20)  # model files are exempt
    r = httpx.post(small_limit.url + f"/api/blobs/sha256:{hashlib.sha256(blob).hexdigest()}", content=blob, timeout=60)
    assert r.status_code == 201
    assert httpx.get(small_limit.url + "/api/version").status_code == 200


def test_a_500_leaves_the_keepalive_connection_usable(small_limit: Daemon) -> None:
    app = small_limit.server.config.app

    async def broken() -> None:
        raise RuntimeError("secret /srv/path/to/store detail")

    if not any(getattr(r, "path", "") == "/test/broken" for r in app.router.routes):
        app.add_api_route("/test/broken", broken, methods=["GET"])
    host, port = small_limit.url.removeprefix("http://").split(":")
    req = b"GET /test/broken HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for _ in range(2):
            status, body = _http_exchange(sock, req)
            assert status == 500 and json.loads(body) == {"error": INTERNAL_ERROR}
            assert b"secret" not in body
        status, body = _http_exchange(sock, b"GET /api/version HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert status == 200 and b"version" in body


def test_startup_prunes_unreferenced_blobs(tmp_path: Path, synthetic_model) -> None:
    import os
    import time

    from evenflow.daemon.store import ModelStore, create_model
    from evenflow.daemon.store.layout import PRUNE_GRACE_S

    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    store = ModelStore(tmp_path / "models")
    kept = store.add_blob_file(gguf)
    list(create_model(store, "tiny", files={gguf.name: kept}))
    day_old = time.time() - PRUNE_GRACE_S - 60
    stray = store.add_blob_bytes(b"an upload whose create never came")
    os.utime(store.blob_path(stray), (day_old, day_old))
    d = start_daemon(tmp_path, noprune=True)  # OLLAMA_NOPRUNE: left alone
    d.stop()
    assert store.has_blob(stray)
    d = start_daemon(tmp_path)
    try:
        assert not store.has_blob(stray) and store.has_blob(kept)
        r = httpx.post(d.url + "/api/show", json={"model": "tiny"}, timeout=60)
        assert r.status_code == 200
    finally:
        d.stop()


def test_a_restart_keeps_uploads_whose_create_is_still_to_come(tmp_path: Path, synthetic_model) -> None:
    # issue 27: a daemon restarting (after a crash, say) between a client's upload and its create pruned the upload,
    # and a second daemon starting on the store removed the temp file of an upload in progress
    import hashlib
    import os
    import time

    from evenflow.daemon.store import ModelStore, create_model
    from evenflow.daemon.store.layout import PRUNE_GRACE_S

    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    data = gguf.read_bytes()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    store = ModelStore(tmp_path / "models")
    old = store.add_blob_bytes(b"uploaded a day ago, checked again just now")
    day_old = time.time() - PRUNE_GRACE_S - 60
    d = start_daemon(tmp_path)
    try:
        assert httpx.post(f"{d.url}/api/blobs/{digest}", content=data, timeout=60).status_code == 201
        os.utime(store.blob_path(old), (day_old, day_old))
        # a client about to create checks its blob first (HEAD): that marks it as wanted now
        assert httpx.head(f"{d.url}/api/blobs/{old}", timeout=60).status_code == 200
    finally:
        d.stop()
    writer = store.layout.blob_writer("sha256:" + "ab" * 32)  # another daemon's upload, half written
    writer.write(b"first half")
    try:
        d = start_daemon(tmp_path)  # restarted between the uploads and the create
        try:
            assert writer.tmp.exists()  # the live upload's temp file is still there
            assert store.has_blob(old)
            r = httpx.post(d.url + "/api/create", json={"model": "tiny", "files": {"tiny.gguf": digest},
                                                       "stream": False}, timeout=120)
            assert r.status_code == 200, r.text
        finally:
            d.stop()
    finally:
        writer.abort()
    assert not writer.tmp.exists()


def test_version_answers_while_big_inputs_are_being_prepared(tmp_path: Path, synthetic_model) -> None:
    # Two clients loop on a 4 MB prompt and a template bomb (both end in 400); /api/version must answer while
    # that work is running in the pool. An ordering of events, not a timing bound (latency figures: the soak
    # script under docs/bench).
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path, backend=BACKENDS[0], context_length="1024")
    stop = threading.Event()
    statuses: list[int] = []
    threads: list[threading.Thread] = []
    try:
        upload_model(d.url, gguf, "tiny")
        # truncate: false, or the 4 MB prompt is cut to the context and answered, as Ollama does
        bodies = [{"model": "tiny", "prompt": "word " * (4 * 2**20 // 5), "stream": False, "truncate": False},
                  {"model": "tiny", "prompt": "x", "stream": False,
                   "template": "{{ range 3000 }}{{ range 3000 }}x{{ end }}{{ end }}"}]

        def bad_client(body: dict) -> None:
            with httpx.Client(base_url=d.url, timeout=120) as c:
                while not stop.is_set():
                    statuses.append(c.post("/api/generate", json=body).status_code)

        threads += [threading.Thread(target=bad_client, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        answered_while_busy = 0
        with httpx.Client(base_url=d.url, timeout=60) as c:
            deadline = time.monotonic() + 120
            while answered_while_busy < 5 and time.monotonic() < deadline:
                if d.ctx.workers.running == 0:
                    time.sleep(0.005)
                    continue
                r = c.get("/api/version")
                assert r.status_code == 200
                if d.ctx.workers.running > 0:  # bad work was in the pool when we asked and when it answered
                    answered_while_busy += 1
        assert answered_while_busy == 5
    finally:
        stop.set()
        for t in threads:
            t.join(120)
        d.stop()
    assert statuses and set(statuses) == {400}


WIDTH_BOMBS = ['{{ printf "%999999999s" "x" }}', '{{ $x := "xxxxxxxx" }}' +
               '{{ $x = printf "%s%s%s%s%s%s%s%s" $x $x $x $x $x $x $x $x }}' * 10,
               '{{ "x"|center(10**9) }}{% if 1 %}{% endif %}', '{{ "%999999999s"|format("x") }}{# #}',
               '{{ "x" * 10**9 }}{# #}', '{{ "x"|indent(10**9) }}{# #}', '{{ "{:>999999999}".format("x") }}{# #}']


def test_width_bombs_are_400s_while_version_answers_and_a_stream_keeps_going(tmp_path: Path, synthetic_model) -> None:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path, backend=BACKENDS[0], context_length="1024")
    stream_done = threading.Event()
    lines: list[dict] = []
    answers: list[tuple[int, str]] = []
    try:
        upload_model(d.url, gguf, "tiny")

        def stream() -> None:
            try:
                with httpx.stream("POST", d.url + "/api/generate", timeout=300,
                                  # greedy: the synthetic model's EOS (logit 0) never wins it, but can be sampled
                                  json={"model": "tiny", "prompt": "hi",
                                        "options": {"num_predict": 40, "temperature": 0}}) as r:
                    lines.extend(json.loads(line) for line in r.iter_lines())
            finally:
                stream_done.set()

        t = threading.Thread(target=stream)
        t.start()
        rounds = 0
        with httpx.Client(base_url=d.url, timeout=120) as c:
            while rounds < 1 or not stream_done.is_set():  # at least every bomb once, until the stream ends
                for bomb in WIDTH_BOMBS:
                    r = c.post("/api/generate", json={"model": "tiny", "prompt": "x", "stream": False, "template": bomb})
                    answers.append((r.status_code, r.json().get("error", "")))
                    assert c.get("/api/version").status_code == 200
                rounds += 1
        t.join(300)
    finally:
        d.stop()
    assert {s for s, _ in answers} == {400}
    assert all("would build" in e or "too large" in e for _, e in answers), answers[:3]
    assert lines and lines[-1]["done"] and lines[-1]["eval_count"] == 40
    assert not [x for x in lines if "error" in x]  # no error line (the gibberish text itself may spell "error")


def test_prepare_for_a_disconnected_client_stops_and_frees_the_pool(tmp_path: Path, synthetic_model) -> None:
    # Each of the 100,000 steps serialises a 200 kB prompt: many minutes of work within the step budget, so the pool
    # is only free again soon if the render stops at a step once the client has gone (and the counter says so).
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path, backend=BACKENDS[0], context_length="1024")
    try:
        upload_model(d.url, gguf, "tiny")
        warm = {"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}}
        assert httpx.post(d.url + "/api/generate", json=warm, timeout=300).status_code == 200  # loaded
        slow = "{% for i in range(100000) %}{% set s = messages|tojson %}{% endfor %}{{ messages[-1].content }}"
        body = json.dumps({"model": "tiny", "prompt": "word " * 40_000, "stream": False, "template": slow}).encode()
        port = int(d.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            deadline = time.monotonic() + 300
            while d.ctx.workers.running == 0:
                assert time.monotonic() < deadline, "the render never started"
                time.sleep(0.01)
        deadline = time.monotonic() + 300  # far less than the render's time, far more than one step
        while d.ctx.workers.running:
            assert time.monotonic() < deadline, "the render went on for a client that had gone"
            time.sleep(0.01)
        assert d.ctx.workers.cancelled == 1
        r = httpx.post(d.url + "/api/generate", json=warm, timeout=300)
        assert r.status_code == 200 and r.json()["done"]
    finally:
        d.stop()
