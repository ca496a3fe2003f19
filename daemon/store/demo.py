"""The synthetic `demo` model a fresh daemon creates, so `evenflow run demo` works with no download."""
from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .create import create_model
from .show import SYNTHETIC_NOTE
from .weight_info import read_gguf

if TYPE_CHECKING:
    from .store import ModelStore

log = logging.getLogger(__name__)

DEMO_MARKER = ".evenflow-demo-created"  # once created (even if deleted later), a restart never recreates it
# Random weights seldom emit EOS: without a cap a request would run until the context window is full.
DEMO_NUM_PREDICT = 128
# Front-ends send long prompts from the first "hello" (Open WebUI's built-in tools are ~9,000 of the demo's tokens):
# a window above the daemon's 4096 default, as a model PARAMETER (a request's num_ctx still wins).
DEMO_NUM_CTX = 16384


def create_demo_model(store: "ModelStore", name: str = "demo", preset: str = "demo", gguf_dtype: str = "q8_0") -> str:
    """Write the synthetic factory's GGUF as a blob and create `name` with its chat template; returns the name."""
    from ...backends.synthetic import make_model, make_spec  # local: numpy-heavy, only needed here

    with tempfile.TemporaryDirectory(prefix="evenflow-demo-") as tmp:
        path = make_model(make_spec(preset), tmp, formats=("gguf",), gguf_dtype=gguf_dtype)["gguf"]
        digest = store.add_blob_file(path)
    info = read_gguf(store.blob_path(digest))
    params: dict = {"num_predict": DEMO_NUM_PREDICT, "num_ctx": DEMO_NUM_CTX}
    if info.eos_token:
        params["stop"] = [info.eos_token]
    for status in create_model(store, name, files={Path(path).name: digest}, template=info.chat_template,
                               parameters=params, license=SYNTHETIC_NOTE):
        log.debug("demo model: %s", status)
    (store.root / DEMO_MARKER).write_text(name + "\n", encoding="utf-8")
    log.info("created the synthetic demo model %r (%s parameters)", name, info.parameter_count)
    return name


def ensure_demo_model(store: "ModelStore", name: str = "demo") -> bool:
    """On a first start (our store has no models and never had the demo) create it; True if created."""
    if (store.root / DEMO_MARKER).exists() or any(not e.read_only for e in store.list()):
        return False
    create_demo_model(store, name)
    return True
