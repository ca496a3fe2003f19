"""OpenAI's Responses API requests (POST /v1/responses), stateless as Ollama serves it: the body (pydantic), and
its translation to the /v1/chat/completions request it means (messages with tool calls and their results, tools,
reasoning_effort, response_format). What needs stored state or OpenAI's servers (previous_response_id,
conversation, background, built-in tools) is a 400 that says so. Pure functions of the request."""
from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import StrictBool, StrictInt, StrictStr, ValidationError

from ..http.body import Number, RequestModel
from ..http.errors import APIError, describe_validation
from ..openai.plan import EFFORTS
from ..openai.prepare import openai_truncation
from ..openai.request import ChatCompletionRequest


class ResponsesRequest(RequestModel):
    """/v1/responses (stateless): what is not supported is refused where it is read (translate)."""

    model: StrictStr
    input: Any = None  # a string or a list of items, read by `messages`
    instructions: Optional[StrictStr] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Any = None
    parallel_tool_calls: Optional[StrictBool] = None
    reasoning: Optional[dict[str, Any]] = None
    text: Optional[dict[str, Any]] = None
    max_output_tokens: Optional[StrictInt] = None
    temperature: Optional[Number] = None
    top_p: Optional[Number] = None
    seed: Optional[StrictInt] = None  # not OpenAI's: as /v1/chat/completions' seed
    ignore_eos: Optional[StrictBool] = None  # not OpenAI's: as /v1/chat/completions' (vLLM's extension)
    stream: Optional[StrictBool] = False
    store: Optional[StrictBool] = None
    previous_response_id: Optional[StrictStr] = None
    conversation: Any = None
    background: Optional[StrictBool] = None
    prompt: Any = None
    include: Optional[list[StrictStr]] = None
    truncation: Optional[StrictStr] = None
    top_logprobs: Optional[StrictInt] = None
    return_progress: Optional[StrictBool] = None  # as on /v1/chat/completions: response.in_progress with progress
    metadata: Optional[dict[StrictStr, StrictStr]] = None
    user: Optional[StrictStr] = None


ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
UNSUPPORTED_PARTS = {"input_file": "file inputs are not supported",
                     "input_audio": "audio inputs are not supported"}


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def _refuse_stateful(req: ResponsesRequest) -> None:
    """What needs responses kept on the server, or run in the background, is refused: nothing is stored here."""
    if req.previous_response_id is not None:
        raise _bad("previous_response_id is not supported: responses are not stored (this server is stateless); "
                   "send the whole conversation in `input`", "previous_response_id")
    if req.conversation is not None:
        raise _bad("conversation is not supported: conversations are not stored (this server is stateless); "
                   "send the whole conversation in `input`", "conversation")
    if req.background:
        raise _bad("background responses are not supported: set background to false and wait for the answer "
                   "(or stream it)", "background")
    if req.prompt is not None:
        raise _bad("prompt (a stored prompt template) is not supported: send `instructions` and `input`", "prompt")
    if req.top_logprobs:
        raise _bad("top_logprobs is not supported on /v1/responses (use /v1/chat/completions)", "top_logprobs")
    if req.include and "message.output_text.logprobs" in req.include:
        raise _bad("include 'message.output_text.logprobs' is not supported (use /v1/chat/completions)", "include")
    if req.max_output_tokens is not None and req.max_output_tokens < 1:
        raise _bad(f"max_output_tokens must be >= 1, got {req.max_output_tokens}", "max_output_tokens")


def _text(content: Any, where: str) -> str:
    """A message's content (a string or input_text / output_text parts) as one text."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _bad(f"invalid {where}: expected a string or a list of content parts", "input")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in UNSUPPORTED_PARTS:
            raise _bad(f"{where}[{i}]: {UNSUPPORTED_PARTS[kind]}", "input")
        if kind == "input_image":  # as /v1/chat/completions' image_url part (a data URL; checked at prepare)
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise _bad(f"invalid {where}[{i}]: an input_image needs image_url (a data URL)", "input")
            images.append({"type": "image_url", "image_url": {"url": url}})
            continue
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
            continue
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise _bad(f"invalid {where}[{i}]: expected a part of type input_text or output_text with a string "
                       f"'text', got {json.dumps(part)[:200]}", "input")
        texts.append(part["text"])
    if images:  # chat content parts: the text, then the images
        return [{"type": "text", "text": "\n".join(texts)}, *images]  # type: ignore[return-value]
    return "\n".join(texts)


def _reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item given back: its reasoning_text content, else its summary (encrypted content is opaque)."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            if text:
                return text
    return ""


def _string(item: dict[str, Any], key: str, where: str, required: bool = True) -> str:
    value = item.get(key)
    if isinstance(value, str) and (value or not required):
        return value
    if value is None and not required:
        return ""
    raise _bad(f"invalid {where}: '{key}' must be a {'non-empty ' if required else ''}string", "input")


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    name, call_id = _string(item, "name", where), _string(item, "call_id", where)
    args = _string(item, "arguments", where, required=False) or "{}"
    try:
        parsed = json.loads(args)
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        raise _bad(f"invalid {where}: 'arguments' must be a JSON object in a string, got {args[:200]!r}", "input")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """`instructions` and `input` as chat messages: function calls join the assistant turn before them, their
    outputs become tool messages, a reasoning item is the thinking of the assistant turn after it."""
    out: list[dict[str, Any]] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = req.input
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    elif not isinstance(items, list):
        raise _bad("invalid input: expected a string or a list of input items", "input")
    thinking = ""
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"invalid {where}: expected an object", "input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise _bad(f"invalid {where}.role {role!r}: expected one of {', '.join(ROLES)}", "input")
            msg: dict[str, Any] = {"role": role, "content": _text(item.get("content"), f"{where}.content")}
            if role == "assistant" and thinking:
                msg["reasoning"], thinking = thinking, ""
            out.append(msg)
        elif kind == "function_call":
            call = _function_call(item, where)
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
            if thinking:
                out[-1]["reasoning"], thinking = thinking, ""
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "content": text, "tool_call_id": call_id})
        elif kind == "reasoning":
            thinking = _reasoning_text(item)
        elif kind == "item_reference":
            raise _bad(f"{where}: item_reference is not supported: items are not stored; send the item itself",
                       "input")
        else:
            raise _bad(f"{where}: input item type {kind!r} is not supported (message, function_call, "
                       f"function_call_output and reasoning are)", "input")
    if not any(m["role"] != "system" for m in out):
        raise _bad("input is empty: give a string or at least one message", "input")
    return out


def function_tools(req: ResponsesRequest) -> list[tuple[dict[str, Any], str | None]]:
    """The request's function tools with their namespace (a `namespace` tool groups function tools); any other
    tool type (web_search, file_search, ...) runs on OpenAI's servers and is a 400 here."""
    out: list[tuple[dict[str, Any], str | None]] = []
    for i, t in enumerate(req.tools or []):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind == "namespace" and isinstance(t.get("tools"), list):
            for j, inner in enumerate(t["tools"]):
                if not isinstance(inner, dict) or inner.get("type") != "function":
                    raise _bad(f"tools[{i}].tools[{j}]: only function tools are supported in a namespace", "tools")
                out.append((inner, t.get("name")))
        elif kind == "function":
            out.append((t, None))
        else:
            raise _bad(f"tools[{i}]: tool type {kind!r} is not supported: only function tools (built-in tools run "
                       f"on OpenAI's servers)", "tools")
    return out


def tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    """Function tools in the chat shape."""
    out = []
    for t, _ in function_tools(req):
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise _bad("a function tool needs a non-empty string 'name'", "tools")
        if t.get("parameters") is not None and not isinstance(t["parameters"], dict):
            raise _bad(f"tool {t['name']!r}: 'parameters' must be a JSON schema object", "tools")
        if t.get("description") is not None and not isinstance(t["description"], str):
            raise _bad(f"tool {t['name']!r}: 'description' must be a string", "tools")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out or None


def tool_choice(choice: Any, names: list[str]) -> Any:
    """`tool_choice` in the chat shape: "auto", "none", "required", or one named function."""
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        if choice["name"] not in names:
            raise _bad(f"tool_choice names function {choice['name']!r}, which is not in tools", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _bad(f"invalid tool_choice {json.dumps(choice)[:200]}: expected \"auto\", \"none\", \"required\" or "
               f"{{\"type\": \"function\", \"name\": ...}}", "tool_choice")


def effort(req: ResponsesRequest) -> str | None:
    value = (req.reasoning or {}).get("effort")
    if value is not None and value not in EFFORTS:
        raise _bad(f"invalid reasoning.effort {value!r}: expected none, minimal, low, medium or high", "reasoning")
    return value


def response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    """`text.format` as the chat request's response_format (the same constrained decoding)."""
    fmt = (req.text or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise _bad("text.format json_schema needs 'schema' (a JSON schema object)", "text")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "response", "schema": fmt["schema"],
                                                        "strict": fmt.get("strict")}}
    raise _bad(f"invalid text.format {json.dumps(fmt)[:200]}: expected type \"text\", \"json_object\" or "
               f"\"json_schema\"", "text")


def translate(req: ResponsesRequest) -> ChatCompletionRequest:
    """The Responses request as the /v1/chat/completions request it means; 400 for what cannot be served."""
    _refuse_stateful(req)
    fns = tools(req)
    choice = tool_choice(req.tool_choice, [t["function"]["name"] for t in fns or []])
    body = {"model": req.model, "messages": messages(req), "stream": bool(req.stream),
            "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
            "seed": req.seed, "ignore_eos": req.ignore_eos, "tools": None if choice == "none" else fns, "tool_choice": choice,
            "reasoning_effort": effort(req), "response_format": response_format(req),
            "truncation": "auto" if openai_truncation(req.truncation) else None,
            "return_progress": req.return_progress}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise _bad(describe_validation(e.errors())) from None
