"""Zeroconf on loopback only: a daemon advertises, the browser and `evenflow discover` find it with its TXT fields,
a model change updates `models=`, `EVENFLOW_HOST=auto` reaches it, and the record goes away at shutdown."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from api_harness import BACKENDS, start_daemon, upload_model
from evenflow.link.discover import LanBrowser
from evenflow.daemon.settings import load_settings
from evenflow.daemon.discovery import TXT_STRING_MAX, advertised_addresses, models_txt

KEY = "ef-discovery-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
LOOPBACK = ["127.0.0.1"]


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evenflow.clients.cli", *args], capture_output=True, text=True,
                          env=os.environ | env, timeout=120)


def test_advertise_find_update_reach_withdraw(tmp_path: Path, synthetic_model) -> None:
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    backend = "llamacpp" if "llamacpp" in BACKENDS else BACKENDS[0]
    with LanBrowser(LOOPBACK) as browser:
        d = start_daemon(tmp_path, backend=backend, api_key=KEY, advertise=True, advertise_interfaces="127.0.0.1")
        try:
            port = d.ctx.settings.host.port
            mine = lambda found: [f for f in found if f.port == port]  # noqa: E731
            upload_model(d.url, gguf, "tiny", headers=AUTH)
            [f] = mine(browser.wait_for(lambda fs: any("tiny:latest" in f.models for f in mine(fs)), 30))
            assert (f.address, f.version, f.api, f.auth, f.tls) == ("127.0.0.1", "0.13.0", "ollama,openai", True, False)
            assert f.url == d.url and f.models == ["tiny:latest"] and f.models_total == 1

            assert httpx.post(d.url + "/api/copy", json={"source": "tiny", "destination": "second"},
                              headers=AUTH).status_code == 200
            [f] = mine(browser.wait_for(lambda fs: any("second:latest" in f.models for f in mine(fs)), 30))
            assert sorted(f.models) == ["second:latest", "tiny:latest"] and f.models_total == 2

            r = _cli(["discover", "--interfaces", "127.0.0.1", "--timeout", "3", "--json"], {})
            assert r.returncode == 0, r.stderr
            listed = [x for x in json.loads(r.stdout) if x["port"] == port]
            assert listed and listed[0]["url"] == d.url and listed[0]["auth"] is True

            env = {"EVENFLOW_HOST": "auto", "EVENFLOW_DISCOVER_INTERFACES": "127.0.0.1", "EVENFLOW_API_KEY": KEY}
            r = _cli(["list"], env)
            assert r.returncode == 0 and "tiny:latest" in r.stdout, r.stderr  # (another test daemon may answer first)

            assert httpx.request("DELETE", d.url + "/api/delete", json={"model": "second"},
                                 headers=AUTH).status_code == 200
            browser.wait_for(lambda fs: [f.models for f in mine(fs)] == [["tiny:latest"]], 30)
        finally:
            d.stop()
        # Withdrawn with goodbye packets: gone within seconds, not left to expire (its SRV lives 120 s).
        browser.wait_for(lambda fs: not mine(fs), 30)


def test_models_txt_fits_one_string_with_whole_names() -> None:
    names = [f"model-number-{i:03d}:latest" for i in range(40)]
    txt = models_txt(names)
    assert len(("models=" + txt).encode()) <= TXT_STRING_MAX
    kept = txt.split(",")
    assert 5 < len(kept) < 40 and kept == names[:len(kept)]
    assert models_txt(["a" * 300]) == ""  # a name that cannot fit is left out, not cut


def test_where_it_advertises(tmp_path: Path) -> None:
    base = {"EVENFLOW_API_KEY_FILE": str(tmp_path / "none")}
    assert advertised_addresses(load_settings(base)) == []  # loopback only: nobody on the LAN could connect
    assert advertised_addresses(load_settings(base | {"EVENFLOW_ADVERTISE_INTERFACES": "127.0.0.1"})) == LOOPBACK
    assert advertised_addresses(load_settings(base | {"OLLAMA_HOST": "192.0.2.7:8080"})) == ["192.0.2.7"]
    every = advertised_addresses(load_settings(base | {"OLLAMA_HOST": "0.0.0.0"}))
    assert "127.0.0.1" not in every and all(":" not in a for a in every)


def test_loopback_daemon_asked_to_advertise_serves_without_it(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, advertise=True)
    try:
        assert d.ctx.advertiser is None and httpx.get(d.url + "/api/tags").status_code == 200
    finally:
        d.stop()
