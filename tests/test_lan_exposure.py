"""Exposing the daemon: refusing an open non-loopback bind, the insecure opt-out's warnings, TLS, key settings."""
from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from evenflow.daemon.settings import ConfigError, exposure_error, load_settings
from evenflow.daemon.server import create_app

NO_KEY = {"EVENFLOW_API_KEY_FILE": "/nonexistent/evenflow-key"}


def test_non_loopback_needs_a_key_or_the_explicit_opt_out() -> None:
    assert exposure_error(load_settings(NO_KEY)) is None  # loopback: nothing changes
    assert exposure_error(load_settings(NO_KEY | {"EVENFLOW_HOST": "[::1]:9"})) is None
    msg = exposure_error(load_settings(NO_KEY | {"OLLAMA_HOST": "0.0.0.0"}))
    assert msg and "without an API key" in msg and "evenflow key new" in msg and "--insecure-no-auth" in msg
    assert exposure_error(load_settings(NO_KEY | {"OLLAMA_HOST": "192.168.1.5", "EVENFLOW_API_KEY": "k" * 16})) is None
    assert exposure_error(load_settings(NO_KEY | {"OLLAMA_HOST": "0.0.0.0", "EVENFLOW_INSECURE_NO_AUTH": "1"})) is None


def test_key_sources_and_bad_values(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("from-the-file-0123456789\n")
    s = load_settings({"EVENFLOW_API_KEY_FILE": str(f)})
    assert s.api_key == "from-the-file-0123456789" and s.api_key_source == f"key file {f}"
    s = load_settings({"EVENFLOW_API_KEY_FILE": str(f), "EVENFLOW_API_KEY": "from-the-env-0123456789"})
    assert s.api_key == "from-the-env-0123456789" and s.api_key_source == "EVENFLOW_API_KEY"
    assert "from-the" not in repr(s)  # the key never reaches a log line through the settings' repr
    s = load_settings({"EVENFLOW_API_KEY_FILE": str(f)}, {"api_key": "from-the-flag-0123456789"})
    assert s.api_key_source == "--api-key"
    with pytest.raises(ConfigError, match="at least 16") as e:
        load_settings(NO_KEY | {"EVENFLOW_API_KEY": "short-secret"})
    assert "short-secret" not in str(e.value)
    f.write_text("two words but long enough\n")
    with pytest.raises(ConfigError, match="printable ASCII without spaces"):
        load_settings({"EVENFLOW_API_KEY_FILE": str(f)})
    with pytest.raises(ConfigError, match="go together"):
        load_settings(NO_KEY | {"EVENFLOW_TLS_CERT": str(f)})
    with pytest.raises(ConfigError, match="no such file"):
        load_settings(NO_KEY | {"EVENFLOW_TLS_CERT": str(tmp_path / "c.pem"), "EVENFLOW_TLS_KEY": str(f)})
    with pytest.raises(ConfigError, match="EVENFLOW_ADVERTISE_INTERFACES"):
        load_settings(NO_KEY | {"EVENFLOW_ADVERTISE_INTERFACES": "127.0.0.1,eth0"})


def _serve(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "evenflow.clients.cli", "serve", *args], env=os.environ | env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_serve_refuses_an_open_lan_bind_before_binding() -> None:
    # The refusal comes before the socket is bound, so asking for 0.0.0.0 here opens nothing.
    p = _serve(["--host", "0.0.0.0:0", "--no-demo"], NO_KEY)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 1 and "refusing to listen on 0.0.0.0:0 without an API key" in out


def test_insecure_opt_out_warns_at_start_and_in_the_hello(tmp_path: Path) -> None:
    # The app is told it is bound to 0.0.0.0 but is served on a loopback socket (tests never leave loopback).
    settings = load_settings(NO_KEY | {"EVENFLOW_HOST": "0.0.0.0:11999", "EVENFLOW_INSECURE_NO_AUTH": "1",
                                       "EVENFLOW_MODELS": str(tmp_path), "EVENFLOW_NO_DEMO": "1"})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    try:
        while not server.started:
            assert t.is_alive()
            time.sleep(0.02)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        with httpx.stream("GET", url + "/api/events", headers={"Host": "evil.example"}, timeout=30) as r:
            hello = json.loads(next(r.iter_lines()))
        assert hello["auth"] is False and "INSECURE" in hello["warnings"][0]
    finally:
        server.should_exit = True
        t.join(30)


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_serves_https_with_the_key(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    p = _serve(["--host", "127.0.0.1:0", "--no-demo", "--models", str(tmp_path / "models"), "--tls-cert", str(cert),
                "--tls-key", str(key)], NO_KEY | {"EVENFLOW_API_KEY": "tls-test-key-0123456789"})
    try:
        url = None
        for line in p.stdout:  # the start-up line names the real port
            m = re.search(r"listening on (https://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        assert url, "the daemon did not start"
        assert "API key from EVENFLOW_API_KEY" in line and "tls-test-key" not in line
        ctx = ssl.create_default_context(cafile=str(cert))
        deadline = time.monotonic() + 60
        while True:
            try:
                r = httpx.get(url + "/", verify=ctx)
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.1)
        assert r.status_code == 200 and r.text == "Ollama is running"
        assert httpx.get(url + "/api/version", verify=ctx).status_code == 401
        r = httpx.get(url + "/api/version", verify=ctx, headers={"Authorization": "Bearer tls-test-key-0123456789"})
        assert r.json()["version"] == "0.13.0"
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused by a verifying client
            httpx.get(url + "/")
    finally:
        p.terminate()
        p.wait(60)
