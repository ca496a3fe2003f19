"""/api/create: build a manifest from uploaded blobs (`files`) or an existing model (`from_`) plus overrides.

Everything is validated before the returned iterator yields its first status line, so the HTTP layer can
answer 400/404 with a real status; the iterator then writes layers and the manifest (atomically).
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Iterator

from ...backends.remote.endpoint import FROM_SHAPE, SETTING_KEYS as REMOTE_SETTING_KEYS
from ...backends.remote.endpoint import EndpointError, RemoteEndpoint, is_remote_from
from .hfdir import safe_relpath
from .store_errors import BlobNotFound, InvalidModel, NotSupported
from .manifest import (CONFIG_MEDIA_TYPE, MT_ADAPTER, MT_FILE, MT_LICENSE, MT_MESSAGES, MT_MODEL, MT_PARAMS, MT_PROJECTOR,
                       MT_PROMPT, MT_SYSTEM, MT_TEMPLATE, Layer, Manifest, ModelConfig)
from .modelfile import InvalidParameter, format_params
from .names import parse_digest, parse_name
from .store import ModelStore
from .weight_info import WeightsError, human_number, is_projector, read_gguf, read_hf

log = logging.getLogger(__name__)

MESSAGE_ROLES = ("system", "user", "assistant", "tool")


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise InvalidModel(f"messages must be a list, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidModel(f"messages[{i}] must be an object with role and content")
        role = str(m.get("role", "")).lower()
        if role not in MESSAGE_ROLES:
            raise InvalidModel(f"messages[{i}].role {m.get('role')!r} is invalid; allowed: {', '.join(MESSAGE_ROLES)}")
        content = m.get("content", "")
        if not isinstance(content, str):
            raise InvalidModel(f"messages[{i}].content must be a string")
        msg = {k: v for k, v in m.items() if v not in (None, "", [])}
        msg.update(role=role, content=content)
        out.append(msg)
    return out


def _check_files(store: ModelStore, files: Any) -> dict[str, str]:
    if not isinstance(files, dict) or not files:
        raise InvalidModel("files must be a non-empty object mapping file names to sha256 digests")
    out: dict[str, str] = {}
    for fname, digest in files.items():
        safe_relpath(str(fname))
        hexd = parse_digest(str(digest))
        if not store.has_blob("sha256:" + hexd):
            raise BlobNotFound("sha256:" + hexd)
        out[str(fname).replace("\\", "/")] = "sha256:" + hexd
    return out


def _licenses(license: Any) -> list[str]:
    if license is None or license == "":
        return []
    if isinstance(license, str):
        return [license]
    if isinstance(license, list) and all(isinstance(x, str) for x in license):
        return [x for x in license if x]
    raise InvalidModel(f"license must be a string or a list of strings, got {license!r}")


def create_model(store: ModelStore, name: str, *, files: dict[str, str] | None = None, from_: str | None = None,
                 template: str | None = None, system: str | None = None, parameters: dict[str, Any] | None = None,
                 messages: list[dict[str, Any]] | None = None, license: str | list[str] | None = None,
                 adapters: dict[str, str] | None = None, quantize: str | None = None) -> Iterator[str]:
    """Validate eagerly, then return the iterator that performs the create and yields status lines."""
    target = parse_name(name)
    if adapters:
        raise NotSupported("adapters (LoRA) are not supported yet")
    if quantize:
        raise NotSupported(f"quantization is not supported yet (asked for {quantize!r}); upload a quantized GGUF instead")
    if not from_ and not files:
        raise InvalidModel("neither 'from' or 'files' was specified")
    parameters = dict(parameters or {})
    settings = {k: parameters.pop(k) for k in REMOTE_SETTING_KEYS if k in parameters}
    if settings and not is_remote_from(from_):
        raise InvalidModel(f"parameter {', '.join(sorted(settings))} applies only to a remote model "
                           f"(FROM {FROM_SHAPE})")
    try:
        params = format_params(parameters)
    except InvalidParameter as e:
        raise InvalidModel(str(e)) from e
    msgs = _check_messages(messages) if messages is not None else None
    licenses = _licenses(license)
    if template:
        # jinja2 only when a template is given: the CLI imports the store without it
        from ..prompt.templates import TemplateError, check_template  # noqa: PLC0415

        try:
            check_template(template)
        except TemplateError as e:
            raise InvalidModel(f"template error: {e}") from e
    if is_remote_from(from_):
        return _run(store, target, [], _remote_config(from_, settings, files, template), "using remote endpoint",
                    None, system, params, msgs, licenses)
    if from_:
        base = store.manifest(from_)  # ModelNotFound / InvalidName propagate (404 / 400)
        layers, config, status = list(base.layers), base.config, None
        base_params = store.layer_json(base, MT_PARAMS, {})
        if base.find(MT_ADAPTER):
            raise NotSupported(f"model '{from_}' has a LoRA adapter layer; adapters are not supported yet")
    else:  # GGUF/safetensors headers are read now, so a bad file is a 400 before the first status line
        layers, config, status = _weights_layers(store, _check_files(store, files))
        base_params = {}
    return _run(store, target, layers, config, status, template, system, {**base_params, **params} if params else {},
                msgs, licenses)


def _remote_config(from_: str, settings: dict[str, Any], files: Any, template: str | None) -> ModelConfig:
    """A remote model: no weights, its endpoint in the config blob."""
    if files:
        raise InvalidModel("a remote model has no files: give 'from' an openai+http URL or 'files', not both")
    if template:
        raise InvalidModel("TEMPLATE does not apply to a remote model: the upstream engine applies its own chat "
                           "template")
    try:
        ep = RemoteEndpoint.parse(from_, settings)
    except EndpointError as e:
        raise InvalidModel(str(e)) from e
    return ModelConfig(model_format="remote", model_family="remote", model_families=["remote"],
                       extra={"remote": ep.to_json()})


def _weights_layers(store: ModelStore, files: dict[str, str]) -> tuple[list[Layer], ModelConfig, str]:
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    shown = {str(store.blob_path(d)): f"{f} ({d})" for f, d in files.items()}
    try:
        # Ollama's create: a GGUF whose general.architecture is `clip` is the vision projector, stored as its layer
        projectors = [f for f in ggufs if is_projector(store.blob_path(files[f]))]
        ggufs = [f for f in ggufs if f not in projectors]
        if len(ggufs) > 1 or len(projectors) > 1:
            raise InvalidModel(f"one model .gguf and at most one projector .gguf per model are supported, got "
                               f"{', '.join(sorted(ggufs + projectors))}")
        if projectors and not ggufs:
            raise InvalidModel(f"{projectors[0]} is a vision projector (architecture clip); give the model's GGUF "
                               "too (a second FROM line)")
        if ggufs:
            digest = files[ggufs[0]]
            path = store.blob_path(digest)
            info = read_gguf(path, check=True)
            layers = [Layer(MT_MODEL, digest, path.stat().st_size)]
            if projectors:
                pdig = files[projectors[0]]
                layers.append(Layer(MT_PROJECTOR, pdig, store.blob_path(pdig).stat().st_size))
            status = "parsing GGUF"
        else:
            if not any(f.endswith(".safetensors") for f in files) or "config.json" not in files:
                raise InvalidModel("files must hold one .gguf file, or config.json plus *.safetensors "
                                   f"(got {', '.join(sorted(files))})")
            paths = {f: store.blob_path(d) for f, d in files.items()}
            info = read_hf(paths)
            layers = [Layer(MT_FILE, d, paths[f].stat().st_size, name=f) for f, d in sorted(files.items())]
            status = "parsing safetensors model"
    except WeightsError as e:  # the message names the file as the client called it, never a store path
        text = str(e)
        for path, name in shown.items():
            text = text.replace(path, name)
        raise InvalidModel(text) from None
    family = info.family
    cfg = ModelConfig(model_format=info.format, model_family=family, model_families=[family] if family else [],
                      model_type=human_number(info.parameter_count) if info.parameter_count else "",
                      file_type=info.file_type)
    return layers, cfg, status


def _run(store: ModelStore, target: Any, layers: list[Layer], config: Layer | ModelConfig, status: str | None,
         template: str | None, system: str | None, params: dict[str, Any], msgs: list[dict[str, Any]] | None,
         licenses: list[str]) -> Iterator[str]:
    if status:
        yield status
    for lay in layers:
        yield f"using existing layer {lay.digest}"

    def put(media_type: str, data: bytes, replace: tuple[str, ...] = ()) -> Iterator[str]:
        nonlocal layers
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        existed = store.has_blob(digest)
        if not existed:
            store.add_blob_bytes(data)
        layers = [lay for lay in layers if lay.media_type not in (replace or (media_type,))]
        if not any(lay.digest == digest and lay.media_type == media_type for lay in layers):
            layers.append(Layer(media_type, digest, len(data)))
        yield f"{'using existing' if existed else 'creating new'} layer {digest}"

    if template:
        yield from put(MT_TEMPLATE, template.encode(), (MT_TEMPLATE, MT_PROMPT))
    if system:
        yield from put(MT_SYSTEM, system.encode())
    if params:  # already merged over the base model's params
        yield from put(MT_PARAMS, json.dumps(params, ensure_ascii=False).encode())
    if msgs is not None:
        yield from put(MT_MESSAGES, json.dumps(msgs, ensure_ascii=False).encode())
    for text in licenses:
        yield from put(MT_LICENSE, text.encode(), ("__append__",))
    if isinstance(config, Layer):  # from a base model: its config blob as is (re-serialising could change bytes)
        config_layer = config
    else:
        cfg_bytes = config.to_bytes()
        config_layer = Layer(CONFIG_MEDIA_TYPE, store.add_blob_bytes(cfg_bytes), len(cfg_bytes))
    manifest = Manifest(config_layer, layers)
    yield "writing manifest"
    digest = store.write_manifest(target, manifest)
    log.info("created model %s (manifest sha256:%s)", target.display(), digest)
    yield "success"
