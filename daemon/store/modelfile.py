"""Modelfile text: typed PARAMETERs (Ollama's api.FormatParams), rendering for /api/show, parsing for the CLI."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from ...backends.remote.endpoint import SETTING_KEYS as REMOTE_SETTING_KEYS

log = logging.getLogger(__name__)

# Ollama's api.Options / api.Runner keys and their Go types.
_INT = {"num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "seed", "num_predict", "top_k",
        "repeat_last_n", "draft_num_predict", "mirostat"}
_FLOAT = {"top_p", "min_p", "typical_p", "temperature", "repeat_penalty", "presence_penalty", "frequency_penalty",
          "tfs_z", "mirostat_tau", "mirostat_eta"}
_BOOL = {"use_mmap", "numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock", "penalize_newline",
         "embedding_only"}
_LIST = {"stop"}
# evenflow's own: the name of a draft model for speculative decoding (Modelfile `DRAFT NAME`, daemon/manager.py)
_STR = {"draft_model"}
DEPRECATED_PARAMS = frozenset({"penalize_newline", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock",
                               "mirostat", "mirostat_tau", "mirostat_eta"})
PARAMETER_KEYS = frozenset(_INT | _FLOAT | _BOOL | _LIST | _STR)
MESSAGE_ROLES = ("system", "user", "assistant")
INSTRUCTIONS = ("from", "license", "template", "system", "adapter", "draft", "renderer", "parser", "parameter",
                "message", "requires")


class InvalidParameter(ValueError):
    """An unknown PARAMETER key or a value of the wrong type."""


class ModelfileError(ValueError):
    """A Modelfile that cannot be parsed; the message names the line."""


def _convert(key: str, value: Any) -> Any:
    if key in _LIST:
        items = value if isinstance(value, (list, tuple)) else [value]
        if not all(isinstance(s, str) for s in items):
            raise InvalidParameter(f"parameter 'stop' must be a string or a list of strings, got {value!r}")
        return list(items)
    if isinstance(value, (list, tuple, dict)):
        raise InvalidParameter(f"parameter {key!r} takes one value, got {value!r}")
    if key in _STR:
        if not isinstance(value, str) or not value.strip():
            raise InvalidParameter(f"parameter {key!r} must be a model name, got {value!r}")
        return value.strip()
    try:
        if key in _BOOL:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "t"):
                return True
            if text in ("false", "0", "f"):
                return False
            raise ValueError(value)
        if key in _INT:
            if isinstance(value, bool):
                raise ValueError(value)
            if isinstance(value, float):
                if not value.is_integer():
                    raise ValueError(value)
                return int(value)
            return int(str(value).strip())
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    except (TypeError, ValueError):
        kind = "bool" if key in _BOOL else "int" if key in _INT else "float32"
        raise InvalidParameter(f"invalid value {value!r} for parameter {key!r}: must be of type {kind}") from None


def format_params(params: dict[str, Any]) -> dict[str, Any]:
    """Type a parameter dict like Ollama: ints/floats/bools converted, `stop` a list; unknown keys raise."""
    if not isinstance(params, dict):
        raise InvalidParameter(f"parameters must be an object, got {type(params).__name__}")
    out: dict[str, Any] = {}
    for key, value in params.items():
        if key not in PARAMETER_KEYS:
            raise InvalidParameter(f"unknown parameter {key!r}; allowed: {', '.join(sorted(PARAMETER_KEYS))}")
        if key in DEPRECATED_PARAMS:
            log.warning("parameter %s is deprecated", key)
        out[key] = _convert(key, value)
    return out


def _go_value(v: Any) -> str:
    """Go's %#v for the value kinds a params layer holds (strings quoted, floats without exponent)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def parameters_text(params: dict[str, Any]) -> str:
    """The /api/show `parameters` field: `%-30s %#v` per value, one line per stop string."""
    lines = []
    for key, value in params.items():
        for v in value if isinstance(value, list) else [value]:
            lines.append(f"{key:<30} {_go_value(v)}")
    return "\n".join(lines)


def _quote(s: str) -> str:
    if "\n" in s or s.startswith(" ") or s.endswith(" ") or '"' in s:
        return f'"""{s}"""'
    return s


def render_modelfile(*, from_: str, display_name: str, template: str | None, system: str | None,
                     params: dict[str, Any], messages: list[dict[str, Any]], licenses: list[str],
                     header_lines: list[str] = (), extra_from: list[str] = ()) -> str:
    """A Modelfile that recreates the model, in the shape `ollama show --modelfile` prints."""
    out = ['# Modelfile generated by "ollama show"', "# To build a new Modelfile based on this, replace FROM with:",
           f"# FROM {display_name}", *[f"# {line}" for line in header_lines], "", f"FROM {from_}",
           *[f"FROM {p}" for p in extra_from]]
    if template:
        out.append(f'TEMPLATE """{template}"""')
    if system:
        out.append(f'SYSTEM """{system}"""')
    for key, value in params.items():
        for v in value if isinstance(value, list) else [value]:
            text = ("true" if v else "false") if isinstance(v, bool) else str(v)
            out.append(f"PARAMETER {key} {_quote(text)}")
    for lic in licenses:
        out.append(f'LICENSE """{lic}"""')
    for m in messages:
        out.append(f"MESSAGE {m.get('role', '')} {_quote(str(m.get('content', '')))}")
    return "\n".join(out) + "\n"


@dataclass
class ModelfileSpec:
    """What a parsed Modelfile asks for, in ModelStore.create / api.CreateRequest terms."""

    from_: str | None = None  # a model name or a local path; the caller decides which (Ollama: path if it exists)
    parameters: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    adapters: list[str] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    requires: str | None = None
    # FROM lines after the first: further GGUF files of the model (Ollama: a vision projector, told apart at create
    # by its `clip` architecture)
    extra_from: list[str] = field(default_factory=list)


def _read_value(text: str, pos: int, lineno: int) -> tuple[str, int]:
    """Read a bare, "quoted" or \"\"\"multi-line\"\"\" value starting at `pos`; return it and the new pos."""
    if text.startswith('"""', pos):
        end = text.find('"""', pos + 3)
        if end == -1:
            raise ModelfileError(f"line {lineno}: unterminated \"\"\" string")
        return text[pos + 3 : end], end + 3
    if text.startswith('"', pos):
        end = pos + 1
        buf = []
        while end < len(text) and text[end] != '"':
            if text[end] == "\\" and end + 1 < len(text):
                end += 1
            buf.append(text[end])
            end += 1
        if end >= len(text):
            raise ModelfileError(f"line {lineno}: unterminated string")
        return "".join(buf), end + 1
    end = text.find("\n", pos)
    end = len(text) if end == -1 else end
    return text[pos:end].strip(), end


def parse_modelfile(text: str) -> ModelfileSpec:
    """Parse Modelfile text (instructions case-insensitive, `#` comments, quoted values)."""
    spec = ModelfileSpec()
    raw_params: dict[str, Any] = {}
    remote: dict[str, Any] = {}
    pos, n = 0, len(text)
    while pos < n:
        lineno = text.count("\n", 0, pos) + 1
        eol = text.find("\n", pos)
        line = text[pos : n if eol == -1 else eol]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            pos = n if eol == -1 else eol + 1
            continue
        start = pos + (len(line) - len(line.lstrip()))
        word = stripped.split(None, 1)[0]
        inst = word.lower()
        if inst not in INSTRUCTIONS:
            raise ModelfileError(f"line {lineno}: command must be one of " + ", ".join(f'"{i}"' for i in INSTRUCTIONS))
        pos = start + len(word)
        while pos < n and text[pos] in " \t":
            pos += 1
        if inst in ("parameter", "message"):
            sp = pos
            while pos < n and text[pos] not in " \t\n":
                pos += 1
            key = text[sp:pos]
            while pos < n and text[pos] in " \t":
                pos += 1
            value, pos = _read_value(text, pos, lineno)
            if inst == "parameter":
                if key in REMOTE_SETTING_KEYS:  # a remote model's connection settings, checked by create
                    remote[key] = value
                elif key not in PARAMETER_KEYS:
                    raise ModelfileError(f"line {lineno}: unknown parameter '{key}'")
                elif key == "stop":
                    raw_params.setdefault("stop", []).append(value)
                else:
                    raw_params[key] = value
            else:
                if key.lower() not in MESSAGE_ROLES:
                    raise ModelfileError(f"line {lineno}: role must be one of \"system\", \"user\", or \"assistant\"")
                spec.messages.append({"role": key.lower(), "content": value})
        else:
            value, pos = _read_value(text, pos, lineno)
            if inst == "from" and spec.from_ is not None:
                spec.extra_from.append(value)
            elif inst == "from":
                spec.from_ = value
            elif inst == "template":
                spec.template = value
            elif inst == "system":
                spec.system = value
            elif inst == "adapter":
                spec.adapters.append(value)
            elif inst == "license":
                spec.license.append(value)
            elif inst == "requires":
                spec.requires = value
            elif inst == "draft":  # Ollama's instruction for a draft model; here a model of the store, by name
                raw_params["draft_model"] = value
            else:
                log.warning("Modelfile instruction %s is not supported and was ignored", inst.upper())
        nl = text.find("\n", pos)
        pos = n if nl == -1 else nl + 1
    try:
        spec.parameters = {**format_params(raw_params), **remote}
    except InvalidParameter as e:
        raise ModelfileError(str(e)) from e
    if spec.from_ is None:
        raise ModelfileError("no FROM line for the model was specified")
    return spec
