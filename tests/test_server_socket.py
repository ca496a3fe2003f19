"""The daemon's listening socket: every accepted connection sends without Nagle's delay.

Without TCP_NODELAY a kept-alive connection (the default of the ollama, openai and anthropic Python clients) held
each response's first chunk until the client acknowledged the headers, which Linux delays by 40 ms: 40 ms more to
every first token after a connection's first request (docs/bench/remote_overhead.py showed it as 46 ms)."""
from __future__ import annotations

import socket
from pathlib import Path

import httpx

from api_harness import start_daemon


def test_every_accepted_connection_has_tcp_nodelay(tmp_path: Path) -> None:
    d = start_daemon(tmp_path)
    try:
        with httpx.Client(base_url=d.url) as c:  # one kept-alive connection, as the Python clients use
            assert c.get("/api/version").status_code == 200
            assert c.get("/api/tags").status_code == 200
            conns = list(d.server.server_state.connections)
            assert conns, "the daemon holds the client's kept-alive connection"
            for proto in conns:
                sock = proto.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        d.server.should_exit = True
        d.thread.join(30)
