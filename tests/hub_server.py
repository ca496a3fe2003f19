"""A fake Hugging Face hub on loopback (model info with LFS metadata, `resolve` downloads with Range)."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}  # "user/repo" -> filename -> bytes
        self.downloads: list[str] = []  # filenames whose bytes were fetched
        hub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path):
                    files = hub.repos.get(m.group(1))
                    if files is None:
                        return self._send(404, b'{"error":"Repository not found"}',
                                          {"X-Error-Code": "RepoNotFound", "Content-Type": "application/json"})
                    siblings = [{"rfilename": f, "size": len(d),
                                 "lfs": {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134}}
                                for f, d in files.items()]
                    body = json.dumps({"id": m.group(1), "modelId": m.group(1), "sha": COMMIT, "siblings": siblings})
                    return self._send(200, body.encode(), {"Content-Type": "application/json"})
                if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    data = hub.repos.get(m.group(1), {}).get(m.group(3))
                    if data is None or m.group(2) not in (COMMIT, "main"):
                        return self._send(404, b"not found")
                    rng = self.headers.get("Range")
                    start, end = 0, len(data) - 1
                    if rng:
                        a, b = re.fullmatch(r"bytes=(\d+)-(\d*)", rng).groups()
                        start, end = int(a), int(b) if b else end
                    hub.downloads.append(m.group(3))
                    return self._send(206 if rng else 200, data[start:end + 1],
                                      {"Content-Range": f"bytes {start}-{end}/{len(data)}"})
                self._send(404, b"not found")

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
