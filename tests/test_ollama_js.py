"""ollama-js, the official JavaScript client (npm `ollama`, pinned in tests/js/package.json), against a real daemon:
list, show, chat with a JSON schema (plain and streamed), generate with format "json", a stream the client aborts,
embed. `packaging/dev.sh test` installs it with npm; without node or the package the test is skipped, except under
CI, where it must run."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest

from api_harness import BACKENDS, kv_used, start_daemon, upload_model
from test_api_format import PERSON

JS = Path(__file__).parent / "js"


def node_or_skip() -> str:
    node = shutil.which("node")
    if node and (JS / "node_modules" / "ollama").is_dir():
        return node
    if os.environ.get("CI"):
        pytest.fail("node and tests/js/node_modules/ollama are required under CI (packaging/dev.sh test installs them)")
    pytest.skip("node or the ollama npm package is missing (npm install --prefix tests/js)")


def test_ollama_js_common_calls_and_structured_output(tmp_path: Path, synthetic_model) -> None:
    node = node_or_skip()
    gguf = Path(synthetic_model("tiny", formats=("gguf",))["gguf"])
    d = start_daemon(tmp_path, backend=BACKENDS[0], context_length="1024")
    try:
        upload_model(d.url, gguf, "tiny")
        p = subprocess.run([node, str(JS / "ollama_js_client.mjs"), d.url, "tiny", json.dumps(PERSON)],
                           capture_output=True, text=True, timeout=600, cwd=JS)
        assert p.returncode == 0, p.stderr[-3000:]
        out = json.loads(p.stdout.strip().splitlines()[-1])
        assert "tiny:latest" in out["list"] and out["show_family"]
        person = json.loads(out["chat_schema"])  # random weights: only the grammar makes this valid
        jsonschema.validate(person, PERSON)
        assert out["chat_schema_streamed"] == out["chat_schema"] and out["chat_done_reason"] == "stop"
        assert isinstance(json.loads(out["generate_json"]), dict) and out["eval_count"] > 0
        # the window holds 1024 tokens: a stream that was not cut off would have ended by itself, without an error
        assert out["abort_error"] == "AbortError" and 5 <= out["abort_parts"] < 200, out
        assert out["embed_dims"] == [64, 64]
        deadline = time.monotonic() + 60
        while kv_used(d, "tiny:latest") and time.monotonic() < deadline:  # the aborted stream's KV is freed
            time.sleep(0.1)
        assert kv_used(d, "tiny:latest") == 0
    finally:
        d.stop()
