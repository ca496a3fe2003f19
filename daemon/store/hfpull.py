"""`hf.co/{user}/{repo}[:{quant}]` pulls: pick the repo's GGUF for the quant tag, download it as a blob, create.

The hub's file list (with LFS sha256 and size) comes from `huggingface_hub`, which honours `HF_ENDPOINT`;
the bytes go through the same resumable, verified blob download as registry pulls.
"""
from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Iterator

from .create import create_model
from .download import DownloadError
from .store_errors import StoreError
from .manifest import Layer, MT_MODEL
from .names import ModelName
from .registry import RegistryError, wait_download

if TYPE_CHECKING:
    from .store import ModelStore

HF_HOSTS = ("hf.co", "huggingface.co")
# Ollama (and the hub's own Ollama endpoint) take Q4_K_M when no quant is named, else a reasonable one.
DEFAULT_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q5_K_M", "Q6_K", "Q8_0", "BF16", "F16")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


class HubError(StoreError):
    """The hub refused, could not be reached, or the repo has no GGUF for the tag."""


def is_hf_name(name: ModelName) -> bool:
    return name.host.lower() in HF_HOSTS


def _quant_of(filename: str, quant: str) -> bool:
    stem = filename.rsplit("/", 1)[-1][: -len(".gguf")]
    return re.search(rf"(^|[-_.]){re.escape(quant)}$", stem, re.IGNORECASE) is not None


def pick_gguf(files: list[str], tag: str) -> str:
    """The GGUF for `tag` (a quant such as Q8_0, case-insensitive; `latest` = the default quant)."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower())
    if not ggufs:
        raise HubError("the repository has no .gguf file")
    if tag.lower() != "latest":
        match = [f for f in ggufs if _quant_of(f, tag)]
        if not match:
            quants = ", ".join(f.rsplit("/", 1)[-1] for f in ggufs)
            raise HubError(f"no GGUF for the quant {tag!r} in the repository (files: {quants})")
        chosen = match[0]
    else:
        chosen = next((f for q in DEFAULT_QUANTS for f in ggufs if _quant_of(f, q)), ggufs[0])
    if _SPLIT.search(chosen):
        raise HubError(f"{chosen} is a split GGUF; split models are not supported yet")
    return chosen


def pick_mmproj(files: list[str]) -> str | None:
    """The repo's vision projector (an `mmproj` GGUF; F16 preferred, as the hub's Ollama endpoint serves), if any."""
    projs = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" in f.rsplit("/", 1)[-1].lower())
    return next((f for f in projs if re.search(r"f16", f, re.IGNORECASE)), projs[0] if projs else None)


def pull_hf(store: "ModelStore", name: ModelName) -> Iterator[dict[str, Any]]:
    """Progress lines of a hub pull (the model is created under `name`)."""
    from huggingface_hub import HfApi, hf_hub_url  # noqa: PLC0415 - only hub pulls need it
    from huggingface_hub.utils import HfHubHTTPError  # noqa: PLC0415

    endpoint = os.environ.get("HF_ENDPOINT") or None  # read now, not at import, so a changed env is honoured
    repo = f"{name.namespace}/{name.model}"
    yield {"status": "pulling manifest"}
    try:
        info = HfApi(endpoint=endpoint).model_info(repo, files_metadata=True)
    except HfHubHTTPError as e:
        raise HubError(f"pull model manifest: {repo} on {endpoint or 'huggingface.co'}: {e}") from e
    except OSError as e:  # connection errors
        raise HubError(f"pull model manifest: cannot reach {endpoint or 'huggingface.co'}: {e}") from e
    siblings = {s.rfilename: s for s in info.siblings or []}
    filename = pick_gguf(list(siblings), name.tag)
    # the model's GGUF, and its vision projector when the repo has one (create stores it as the projector layer)
    wanted = [f for f in (filename, pick_mmproj(list(siblings))) if f]
    files = {}
    for f in wanted:
        lfs = siblings[f].lfs
        if lfs is None or not getattr(lfs, "sha256", None):
            raise HubError(f"{f}: the hub gave no sha256 for it, so it cannot be verified")
        layer = Layer(MT_MODEL, f"sha256:{lfs.sha256}", int(lfs.size))
        url = hf_hub_url(repo, f, revision=info.sha or "main", endpoint=endpoint)
        if store.has_blob(layer.digest):
            yield {"status": f"pulling {layer.digest[7:19]}", "digest": layer.digest, "total": layer.size,
                   "completed": layer.size}
        else:
            dl = store.downloads.get(layer.digest, layer.size, lambda url=url: url)
            try:
                yield from wait_download(dl, f"pulling {layer.digest[7:19]}")
            except DownloadError as e:
                raise RegistryError(str(e)) from e
        files[f.rsplit("/", 1)[-1]] = layer.digest
    yield {"status": "verifying sha256 digest"}
    for status in create_model(store, name.full(), files=files):
        yield {"status": status}
