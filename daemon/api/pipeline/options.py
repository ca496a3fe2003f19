"""A request's options as typed values, a 400 for a bad one: keep_alive, num_ctx (the model manager settles the
window), fitting a prompt to the window, sampling parameters, logprobs, priority. Plain functions of the request
(and of the loaded model for the window)."""
from __future__ import annotations

import json
from typing import Any

from ...settings import keep_alive_seconds
from ...engine.params import InvalidParams, SamplingParams
from ...model_types import GpuOptions, LoadedModel
from ..http.errors import APIError
from .prompt_size import ContextOverflow


def parse_keep_alive(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return keep_alive_seconds(value)
    except ValueError as e:
        raise APIError(400, str(e)) from None


def requested_num_ctx(options: dict[str, Any] | None) -> int | None:
    """`options.num_ctx` validated (a positive integer) or None."""
    if not options or options.get("num_ctx") is None:
        return None
    v = options["num_ctx"]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise APIError(400, f"option 'num_ctx' must be a positive integer, got {v!r}")
    return v


def requested_gpu(options: dict[str, Any] | None) -> GpuOptions:
    """Ollama's load-time `num_gpu` (layers to offload; -1 = as many as fit, 0 = CPU only) and `main_gpu` (a GPU's
    index): integers, or a 400."""
    if not isinstance(options, dict):
        return GpuOptions()
    values: dict[str, int | None] = {}
    for name, lo in (("num_gpu", -1), ("main_gpu", 0)):
        v = options.get(name)
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise APIError(400, f"option {name!r} must be an integer >= {lo}, got {json.dumps(v)[:100]}")
        values[name] = v
    return GpuOptions(**values)


def requested_draft(req: Any) -> str | None:
    """The draft model a request names: `options.draft_model` (Ollama's API) or the body's `draft_model` (/v1, an
    extension the openai client sends with `extra_body`); a model name, or a 400."""
    options = getattr(req, "options", None)
    v = options.get("draft_model") if isinstance(options, dict) else getattr(req, "draft_model", None)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise APIError(400, f"option 'draft_model' must be a model name, got {json.dumps(v)[:100]}")
    return v


def sampling_params(options: dict[str, Any] | None, defaults: dict[str, Any] | None = None,
                    **overrides: Any) -> SamplingParams:
    """Ollama's precedence (built-in < model PARAMETERs < request options < explicit overrides); 400 on bad values."""
    if options is not None and not isinstance(options, dict):
        raise APIError(400, f"options must be an object, got {type(options).__name__}")
    merged = dict(options or {})
    merged.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return SamplingParams.from_options(merged, defaults)
    except InvalidParams as e:
        raise APIError(400, str(e)) from None
    except TypeError as e:
        raise APIError(400, f"invalid options: {e}") from None


def fit_to_context(prompt_ids: list[int], params: SamplingParams, ctx: int, model: LoadedModel) -> None:
    """400 for a prompt that does not fit the request's window `ctx`. Generation past it is the engine's: the
    sequence's own limit (its num_ctx) ends it with "length" or shifts it (`shift`)."""
    n = len(prompt_ids)
    if n >= ctx:
        raise ContextOverflow(model.name, ctx, model.trained_context, n)


PRIORITY_NAMES = {"interactive": -1, "normal": 0, "background": 1}
MAX_PRIORITY = 1000


def request_priority(value: Any, field: str = "priority", param: str | None = None) -> int:
    """A request's priority: an integer (vLLM's convention: lower is sooner, 0 normal) or a name; 400 otherwise."""
    if value is None:
        return 0
    if isinstance(value, str) and value.strip().lower() in PRIORITY_NAMES:
        return PRIORITY_NAMES[value.strip().lower()]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not -MAX_PRIORITY <= value <= MAX_PRIORITY:
        raise APIError(400, f"{field} must be an integer from -{MAX_PRIORITY} to {MAX_PRIORITY} (lower is sooner) or "
                            f"one of {', '.join(PRIORITY_NAMES)}; got {json.dumps(value)[:100]}", param=param)
    return value


def options_priority(options: Any) -> int:
    """`options.priority` on the Ollama API."""
    return request_priority(options.get("priority") if isinstance(options, dict) else None, "option 'priority'")
