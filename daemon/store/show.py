"""/api/show body: license, a Modelfile that recreates the model, parameters, template, details, model_info."""
from __future__ import annotations

import logging
from typing import Any

from ...backends.remote.endpoint import RemoteEndpoint
from .manifest import MT_MODEL, MT_PROMPT, MT_TEMPLATE
from .modelfile import parameters_text, render_modelfile
from .store import ModelStore
from .weight_info import SYNTHETIC_KEY, projector_info

log = logging.getLogger(__name__)

SYNTHETIC_NOTE = ("evenflow synthetic model: random weights for demos and tests; its output is meaningless text")
_HIDDEN_KEYS = ("general.name", "tokenizer.chat_template")  # Ollama leaves these out of model_info


def show_model(store: ModelStore, name: str, *, verbose: bool = False, system: str | None = None) -> dict[str, Any]:
    """Ollama's ShowResponse for `name`; raises ModelNotFound / InvalidName like resolve."""
    resolved = store.resolve(name)
    if resolved.remote is not None:
        return _show_remote(resolved, system)
    manifest = store.manifest(name)
    info = store.weights_info(manifest, full=verbose)
    model_info: dict[str, Any] = {k: v for k, v in info.metadata.items() if k not in _HIDDEN_KEYS}
    model_info["general.parameter_count"] = info.parameter_count
    if info.synthetic:
        model_info[SYNTHETIC_KEY] = True
    layer_template = store.layer_text(manifest, MT_TEMPLATE, MT_PROMPT)
    model_layer = manifest.first(MT_MODEL)
    from_ = str(store.blob_path(model_layer.digest)) if model_layer else str(resolved.model_path)
    sys_text = system if system is not None else (resolved.system or "")
    licenses = list(resolved.license)
    if info.synthetic and not any(SYNTHETIC_NOTE in lic for lic in licenses):
        licenses.insert(0, SYNTHETIC_NOTE)
    body: dict[str, Any] = {
        "license": "\n".join(licenses),
        "modelfile": render_modelfile(
            from_=from_, display_name=resolved.name, template=layer_template or resolved.template, system=sys_text,
            params=resolved.params, messages=resolved.messages, licenses=resolved.license,
            header_lines=[SYNTHETIC_NOTE] if info.synthetic else [],
            extra_from=[str(resolved.projector_path)] if resolved.projector_path is not None else []),
        "parameters": parameters_text(resolved.params),
        "template": resolved.template or "",
        "system": sys_text,
        "details": resolved.details,
        "model_info": model_info,
        "capabilities": resolved.capabilities,
        "modified_at": resolved.modified_at,
    }
    if resolved.projector_path is not None:
        body["projector_info"] = projector_info(resolved.projector_path)
    if resolved.messages:
        body["messages"] = resolved.messages
    if verbose:
        body["tensors"] = info.tensors
    return body


def _show_remote(resolved: Any, system: str | None) -> dict[str, Any]:
    """A remote model: its endpoint in model_info and the Modelfile (the key's variable name, never the key)."""
    ep = RemoteEndpoint.from_json(resolved.remote)
    sys_text = system if system is not None else (resolved.system or "")
    shown = {**ep.settings(), **resolved.params}
    model_info: dict[str, Any] = {"general.architecture": "remote", "remote.url": ep.url,
                                  "remote.endpoint": ep.base_url, "remote.model": ep.model}
    if ep.api_key_env:
        model_info["remote.api_key_env"] = ep.api_key_env
    body: dict[str, Any] = {
        "license": "\n".join(resolved.license),
        "modelfile": render_modelfile(from_=ep.url, display_name=resolved.name, template=None, system=sys_text,
                                      params=shown, messages=resolved.messages, licenses=resolved.license,
                                      header_lines=[f"remote model served by {ep.base_url}"]),
        "parameters": parameters_text(shown), "template": "", "system": sys_text, "details": resolved.details,
        "model_info": model_info, "capabilities": resolved.capabilities, "modified_at": resolved.modified_at,
        "remote": True,
    }
    if resolved.messages:
        body["messages"] = resolved.messages
    return body
