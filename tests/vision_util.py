"""Images and a vision model for the vision tests: PNGs written with zlib, the tiny text model + its projector."""
from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import httpx


def png(width: int = 32, height: int = 32, seed: int = 0) -> bytes:
    """A valid RGB PNG of random pixels."""
    from evenflow.backends.synthetic.projector import random_png

    return random_png(width, height, seed)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def vision_files() -> tuple[Path, Path]:
    """(text model GGUF, projector GGUF): the tiny llama (hidden 64) and an `mlp` projector into 64."""
    from evenflow.backends.synthetic import cached_model, make_spec
    from evenflow.backends.synthetic.projector import cached_projector

    model = cached_model(make_spec("tiny", architecture="llama"), formats=("gguf",), gguf_dtype="f32")["gguf"]
    return model, cached_projector(64)


def create_vision_model(url: str, name: str) -> None:
    """Upload both GGUFs and create `name` from them (the projector told apart by its clip architecture)."""
    files = {}
    with httpx.Client(base_url=url, timeout=120) as c:
        for path in vision_files():
            data = path.read_bytes()
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            r = c.post(f"/api/blobs/{digest}", content=data)
            assert r.status_code in (200, 201), r.text
            files[path.name] = digest
        r = c.post("/api/create", json={"model": name, "files": files, "stream": False})
        assert r.status_code == 200, r.text
