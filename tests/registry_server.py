"""A small OCI-distribution registry on loopback for the pull/push tests (http.server in a thread).

Serves manifests and blobs with `Range`, can redirect blob GETs to a second server (a "CDN"), accepts
uploads (POST, PATCH, PUT ?digest=) and manifests (PUT), and injects faults: a corrupted blob, a connection
cut after N bytes, 503s, a gate that holds ranged GETs until the test opens it. Written independently of
evenflow's own store code, so a test checks our client against the protocol, not against itself.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MANIFEST_MT = "application/vnd.docker.distribution.manifest.v2+json"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str, str], bytes] = {}  # (ns, model, tag) -> raw bytes
        self.uploads: dict[str, bytearray] = {}
        self.cdn: "Registry | None" = None  # blob GETs answer 307 to it
        self.corrupt: set[str] = set()
        self.cut_after: dict[str, int] = {}  # digest -> bytes sent before the connection is dropped (once)
        self.unavailable = False  # every blob GET answers 503
        self.gate = threading.Event()
        self.gate.set()
        self.ranged = threading.Event()  # set when a ranged blob GET arrives
        self.log: list[tuple[str, str, str]] = []  # (method, path, Range header)
        self.served: Counter[str] = Counter()  # body bytes sent per digest
        self.ranged_gets: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.host = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()

    # ---------------------------------------------------------------------------------- content

    def add_blob(self, data: bytes) -> dict[str, Any]:
        d = sha(data)
        self.blobs[d] = data
        return {"digest": d, "size": len(data)}

    def add_model(self, ns: str, model: str, tag: str, gguf: Path, params: dict[str, Any] | None = None) -> bytes:
        """A manifest with a config blob, the GGUF model layer and (optionally) a params layer; returns its bytes."""
        config = self.add_blob(json.dumps({"model_format": "gguf", "model_family": "llama",
                                           "model_families": ["llama"], "architecture": "amd64",
                                           "os": "linux"}).encode())
        layers = [{"mediaType": "application/vnd.ollama.image.model", **self.add_blob(gguf.read_bytes())}]
        if params is not None:
            layers.append({"mediaType": "application/vnd.ollama.image.params",
                           **self.add_blob(json.dumps(params).encode())})
        raw = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_MT,
                          "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
                          "layers": layers}).encode()
        self.manifests[(ns, model, tag)] = raw
        return raw

    # ---------------------------------------------------------------------------------- HTTP

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        reg = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self) -> None:
                path = self.path.split("?", 1)[0]
                with reg._lock:
                    reg.log.append((self.command, path, self.headers.get("Range", "")))
                if m := re.fullmatch(r"/v2/([^/]+)/([^/]+)/manifests/([^/]+)", path):
                    return self._manifest(*m.groups())
                if m := re.fullmatch(r"/v2/[^/]+/[^/]+/blobs/uploads/?([^/]*)", path):
                    return self._upload(m.group(1))
                if m := re.fullmatch(r"/(?:v2/[^/]+/[^/]+/blobs|cdn)/(sha256:[0-9a-f]{64})", path):
                    return self._blob(m.group(1), cdn=path.startswith("/cdn/"))
                self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}')

            do_GET = do_HEAD = do_POST = do_PATCH = do_PUT = _route

            def _body(self) -> bytes:
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _manifest(self, ns: str, model: str, tag: str) -> None:
                if self.command == "PUT":
                    reg.manifests[(ns, model, tag)] = self._body()
                    return self._send(201)
                raw = reg.manifests.get((ns, model, tag))
                if raw is None:
                    return self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}')
                self._send(200, raw, {"Content-Type": MANIFEST_MT})

            def _upload(self, uid: str) -> None:
                if self.command == "POST":
                    uid = uuid.uuid4().hex
                    reg.uploads[uid] = bytearray()
                    return self._send(202, headers={"Location": f"/v2/x/y/blobs/uploads/{uid}?state=s"})
                if uid not in reg.uploads:
                    return self._send(404)
                reg.uploads[uid] += self._body()
                if self.command == "PATCH":
                    return self._send(202, headers={"Location": f"/v2/x/y/blobs/uploads/{uid}?state=s2"})
                digest = re.search(r"digest=(sha256:[0-9a-f]{64})", self.path)
                data = bytes(reg.uploads.pop(uid))
                if not digest or sha(data) != digest.group(1):
                    return self._send(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
                reg.blobs[digest.group(1)] = data
                self._send(201)

            def _blob(self, digest: str, cdn: bool) -> None:
                data = reg.blobs.get(digest)
                if data is None:
                    return self._send(404, b'{"errors":[{"code":"BLOB_UNKNOWN"}]}')
                if self.command == "HEAD":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    return
                if reg.cdn is not None and not cdn:
                    return self._send(307, headers={"Location": f"http://{reg.cdn.host}/cdn/{digest}?sig=1"})
                if reg.unavailable:
                    return self._send(503, b"unavailable")
                if digest in reg.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                rng = self.headers.get("Range")
                start, end = 0, len(data) - 1
                if rng:
                    with reg._lock:
                        reg.ranged_gets[digest] += 1
                    reg.ranged.set()
                    reg.gate.wait(60)
                    a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", rng).groups()
                    start, end = int(a), int(b) if b else len(data) - 1
                body = data[start:end + 1]
                self.send_response(206 if rng else 200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                self.end_headers()
                cut = reg.cut_after.pop(digest, None) if rng else None
                if cut is not None:
                    self.wfile.write(body[:cut])
                    self.wfile.flush()
                    with reg._lock:
                        reg.served[digest] += cut
                    self.close_connection = True
                    reg.unavailable = True  # later attempts fail too, so the pull gives up
                    return
                if rng:  # only the part fetches count: the redirect probe's body is not read
                    self.wfile.write(body)
                    with reg._lock:
                        reg.served[digest] += len(body)
                else:
                    try:
                        self.wfile.write(body)
                    except OSError:
                        pass

        return H
