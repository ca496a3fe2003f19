"""Anthropic's Messages API requests: the body (pydantic), and its translation to what /api/chat renders: the
template's message dicts (tool calls, tool results, thinking), tools in Ollama's shape, `think`, and the tool
choice. Pure functions of the request; every refusal is a 400 naming the bad field."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import StrictBool, StrictFloat, StrictInt, StrictStr

from .errors import APIError
from .schemas import _Req

Number = Union[StrictInt, StrictFloat]
NO_VISION = "document content blocks are not supported"


class AnthropicMessage(_Req):
    role: Literal["user", "assistant", "system"]  # system: the mid-conversation-system beta (Claude Code sends it)
    content: Union[StrictStr, list[dict[str, Any]]]


class CountTokensRequest(_Req):
    """/v1/messages/count_tokens: the parts of a request that make its prompt."""

    model: StrictStr
    messages: list[AnthropicMessage]
    system: Optional[Union[StrictStr, list[dict[str, Any]]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[dict[str, Any]] = None
    thinking: Optional[dict[str, Any]] = None
    output_config: Optional[dict[str, Any]] = None


class MessagesRequest(CountTokensRequest):
    """/v1/messages. Unknown fields (service_tier, container, ...) are ignored, as on the other endpoints."""

    max_tokens: StrictInt
    stream: Optional[StrictBool] = False
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    top_k: Optional[StrictInt] = None
    stop_sequences: Optional[list[StrictStr]] = None
    metadata: Optional[dict[str, Any]] = None
    return_progress: Optional[StrictBool] = None  # evenflow's: prompt progress in `ping` events (the SDK skips them)


@dataclass
class Conversation:
    """A Messages request in /api/chat's terms."""

    messages: list[dict[str, Any]]  # the template's message dicts
    tools: list[dict[str, Any]] | None  # Ollama/OpenAI function tools, None when the request has none (or "none")
    think: bool | None  # None: the model's default (as /api/chat without `think`)
    forced: list[dict[str, Any]] | None = None  # tool_choice any/tool: the tools one of which must be called
    effort: str | None = None  # output_config.effort: the think level of a model that thinks, when `thinking` is absent
    schema: dict[str, Any] | None = None  # output_config.format: the reply is JSON of this schema


def _bad(message: str) -> APIError:
    return APIError(400, message)


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}: a text block needs 'text' (a string)")
    return text


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _bad(f"{where}: each content block must be an object with a 'type'")
    if block["type"] == "document":
        raise _bad(f"{where}: {NO_VISION}")
    return block["type"]


def _image_source(block: dict[str, Any], where: str) -> str:
    """An image block's source as a data URL (base64) or its URL (refused at prepare: never fetched)."""
    src = block.get("source")
    if isinstance(src, dict) and src.get("type") == "base64" and isinstance(src.get("data"), str):
        media = src.get("media_type") if isinstance(src.get("media_type"), str) else "image/png"
        return f"data:{media};base64,{src['data']}"
    if isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        return src["url"]
    raise _bad(f"{where}: an image block needs source {{type: base64, media_type, data}}")


def system_text(system: str | list[dict[str, Any]] | None, where: str = "system") -> str | None:
    """`system` as one string: a string, or text blocks joined by newlines (cache_control is ignored)."""
    if system is None or isinstance(system, str):
        return system or None
    parts = []
    for i, block in enumerate(system):
        if _block_type(block, f"{where}.{i}") != "text":
            raise _bad(f"{where}.{i}: only text blocks are allowed in system text, got {block['type']!r}")
        parts.append(_text(block, f"{where}.{i}"))
    return "\n".join(parts) or None


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    if content is None or isinstance(content, str):
        text = content or ""
    elif isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if _block_type(part, f"{where}.content.{j}") != "text":
                raise _bad(f"{where}.content.{j}: a tool_result holds text blocks, got {part['type']!r}")
            parts.append(_text(part, f"{where}.content.{j}"))
        text = "\n".join(parts)
    else:
        raise _bad(f"{where}: tool_result 'content' must be a string or a list of text blocks")
    if block.get("is_error") is True:
        text = "Error: " + text  # the model is told the call failed (Anthropic marks it; templates have no field)
    return text


def _message(m: AnthropicMessage, i: int, names: dict[str, str]) -> list[dict[str, Any]]:
    """One Anthropic message -> template messages: a user's tool results become `tool` messages (before its
    text); an assistant's tool_use blocks its tool_calls, its thinking block its `thinking`."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "system":
        return [{"role": "system", "content": system_text(m.content, f"messages.{i}.content") or ""}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    thinking = ""
    images: list[str] = []
    for j, block in enumerate(m.content):
        where = f"messages.{i}.content.{j}"
        kind = _block_type(block, where)
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use" and m.role == "assistant":
            cid, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(cid, str) or not isinstance(name, str) or not name or not isinstance(args, dict):
                raise _bad(f"{where}: a tool_use block needs 'id' and 'name' (strings) and 'input' (an object)")
            names[cid] = name
            calls.append({"id": cid, "function": {"name": name, "arguments": args}})
        elif kind == "tool_result" and m.role == "user":
            cid = block.get("tool_use_id")
            if not isinstance(cid, str):
                raise _bad(f"{where}: a tool_result block needs 'tool_use_id' (a string)")
            result = {"role": "tool", "content": _tool_result_text(block, where), "tool_call_id": cid}
            if cid in names:
                result["tool_name"] = names[cid]
            results.append(result)
        elif kind == "image" and m.role == "user":
            images.append(_image_source(block, where))
        elif kind == "thinking" and m.role == "assistant":
            if not isinstance(block.get("thinking"), str):
                raise _bad(f"{where}: a thinking block needs 'thinking' (a string)")
            thinking += block["thinking"]
        elif kind == "redacted_thinking" and m.role == "assistant":
            continue  # encrypted by another provider: nothing a local model can read
        else:
            raise _bad(f"{where}: content blocks of type {kind!r} are not supported in {m.role} messages "
                       f"(text, tool_use, thinking in assistant ones; text, tool_result in user ones)")
    out = list(results)
    if texts or calls or thinking or images or not results:
        msg: dict[str, Any] = {"role": m.role, "content": "\n".join(texts)}
        if images:
            msg["images"] = images  # decoded and checked in the prepare step (images.py)
        if calls:
            msg["tool_calls"] = calls
        if thinking:
            msg["thinking"] = thinking
        out.append(msg)
    return out


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Anthropic's custom tools as function tools; server tools (web search, bash, ...) are refused."""
    if not tools:
        return None
    out = []
    for i, t in enumerate(tools):
        kind = t.get("type")
        if kind not in (None, "custom"):
            raise _bad(f"tools.{i}: server tools ({kind!r}) are not supported; define it as a custom tool "
                       f"(name, description, input_schema)")
        name, schema, desc = t.get("name"), t.get("input_schema"), t.get("description")
        if not isinstance(name, str) or not name:
            raise _bad(f"tools.{i}.name: a tool needs a name (a string)")
        if not isinstance(schema, dict):
            raise _bad(f"tools.{i}.input_schema: a tool needs an input_schema (a JSON schema object)")
        if desc is not None and not isinstance(desc, str):
            raise _bad(f"tools.{i}.description: expected a string")
        fn: dict[str, Any] = {"name": name, "description": desc, "parameters": schema} if desc else \
            {"name": name, "parameters": schema}  # in OpenAI's order: templates print the tools as JSON
        out.append({"type": "function", "function": fn})
    return out


def _think(thinking: dict[str, Any] | None) -> bool | None:
    """{type: enabled, budget_tokens} -> think on (the budget is not a limit here); disabled -> off;
    adaptive or absent -> the model's default."""
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise _bad(f"thinking.budget_tokens: expected a positive integer, got {budget!r}")
        return True
    if kind == "disabled":
        return False
    if kind in ("adaptive", "between_tools"):
        return None
    raise _bad(f"thinking.type: expected \"enabled\", \"disabled\", \"adaptive\" or \"between_tools\", got {kind!r}")


EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "max", "max": "max"}


def _output_config(cfg: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
    """output_config: (effort as a think level, the JSON schema of `format`)."""
    cfg = cfg or {}
    effort, fmt = cfg.get("effort"), cfg.get("format")
    if effort is not None and effort not in EFFORTS:
        raise _bad(f"output_config.effort: expected one of {', '.join(EFFORTS)}, got {effort!r}")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "json_schema"
                                and isinstance(fmt.get("schema"), dict)):
        raise _bad("output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}")
    return (EFFORTS[effort] if effort else None), (fmt["schema"] if fmt else None)


def _forced(choice: dict[str, Any] | None, tools: list[dict[str, Any]] | None) -> tuple[bool, list | None]:
    """tool_choice -> (tools stay in the prompt, the tools one of which must be called)."""
    kind = (choice or {}).get("type", "auto")
    if kind == "auto":
        return True, None
    if kind == "none":
        return False, None
    if kind not in ("any", "tool"):
        raise _bad(f"tool_choice.type: expected \"auto\", \"any\", \"tool\" or \"none\", got {kind!r}")
    if not tools:
        raise _bad(f"tool_choice {kind!r} needs tools")
    if kind == "any":
        return True, tools
    name = choice.get("name")  # type: ignore[union-attr]
    picked = [t for t in tools if t["function"]["name"] == name]
    if not picked:
        raise _bad(f"tool_choice.name: {name!r} is not one of the request's tools "
                   f"({', '.join(t['function']['name'] for t in tools)})")
    return True, picked


def conversation(req: CountTokensRequest) -> Conversation:
    """The request in /api/chat's terms; 400 for what cannot be served."""
    if not req.messages:
        raise _bad("messages: at least one message is required")
    msgs: list[dict[str, Any]] = []
    system = system_text(req.system)
    if system:
        msgs.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
    for i, m in enumerate(req.messages):
        msgs += _message(m, i, names)
    tools = _tools(req.tools)
    keep, forced = _forced(req.tool_choice, tools)
    effort, schema = _output_config(req.output_config)
    if forced and schema is not None:
        raise _bad("output_config.format cannot be combined with tool_choice \"any\" or \"tool\"")
    return Conversation(msgs, tools if keep else None, _think(req.thinking), forced, effort, schema)


def check_sampling(req: MessagesRequest) -> None:
    """What Anthropic refuses in the numbers: max_tokens below 1, negative temperature, top_p or top_k."""
    if req.max_tokens < 1:
        raise _bad(f"max_tokens: must be at least 1, got {req.max_tokens}")
    for name in ("temperature", "top_p", "top_k"):
        v = getattr(req, name)
        if v is not None and v < 0:
            raise _bad(f"{name}: must be >= 0, got {v}")
    if req.top_p is not None and req.top_p > 1:
        raise _bad(f"top_p: must be <= 1, got {req.top_p}")
