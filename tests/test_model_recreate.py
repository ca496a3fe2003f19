"""/api/create over a loaded name reaches the loaded copy at the next request, without cutting off a stream."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama

from api_harness import BACKENDS, start_daemon


def _loads(url: str, model: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("evenflow_model_loads_total{") and f'model="{model}"' in line:
            return float(line.split()[-1])
    return 0.0


def test_recreate_a_loaded_model_takes_effect_next_request(tmp_path: Path, synthetic_model) -> None:
    d = start_daemon(tmp_path, backend=BACKENDS[0], context_length="1024")
    try:
        c = ollama.Client(host=d.url)
        digest = c.create_blob(Path(synthetic_model("tiny", formats=("gguf",))["gguf"]))
        assert c.create(model="remade", files={"m.gguf": digest}, parameters={"num_predict": 3}).status == "success"
        first = c.generate("remade", "hello")
        assert first.eval_count <= 3 and _loads(d.url, "remade:latest") == 1
        with httpx.stream("POST", d.url + "/api/generate", timeout=120,
                          json={"model": "remade", "prompt": "hello", "options": {"num_predict": 300}}) as r:
            lines = r.iter_lines()
            assert not json.loads(next(lines))["done"]  # running while the model is re-created
            c.create(model="remade", files={"m.gguf": digest}, system="You are a very long new system prompt.",
                     parameters={"num_predict": 1})
            parts = [json.loads(line) for line in lines]
        last = parts[-1]
        assert last["done"] and last["done_reason"] in ("stop", "length")  # not cut off
        assert last["done_reason"] == "stop" or last["eval_count"] == 300  # and kept its own num_predict
        after = c.generate("remade", "hello")
        assert after.eval_count == 1  # the new PARAMETER
        assert after.prompt_eval_count > first.prompt_eval_count  # the new SYSTEM
        assert _loads(d.url, "remade:latest") == 1  # same weights: no reload
        assert "very long new system prompt" in (c.show("remade").modelfile or "")
    finally:
        d.stop()
