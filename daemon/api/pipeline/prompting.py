"""From a request to its prompt ids for a loaded model: template choice, thinking and tool capabilities, rendering
with the model's special tokens, tokenizing. The API's way into `daemon/prompt/templates.py`."""
from __future__ import annotations

import logging
import weakref
from typing import Any

from ... import cancel
from ...model_types import LoadedModel
from ...prompt import formats
from ...prompt import templates as tpl
from ...store.names import parse_name
from ..http.errors import APIError
from . import prompt_size

log = logging.getLogger(__name__)


def template_of(model: LoadedModel) -> str | None:
    """The store's TEMPLATE wins; else the chat template inside the model files; else Ollama's `{{ .Prompt }}`."""
    return model.record.template or model.runner.chat_template or None


def full_name(model: LoadedModel) -> str:
    try:
        return parse_name(model.name).full()
    except ValueError:
        return model.name


def architecture(model: LoadedModel) -> str | None:
    """The model's `general.architecture` (its family's reply format may follow from it: gpt-oss)."""
    info = model.runner.info
    return formats.family_architecture(info.architecture, info.metadata) or None


def capabilities(model: LoadedModel) -> list[str]:
    return tpl.template_capabilities(template_of(model), architecture(model))


def supports_tools(model: LoadedModel) -> bool:
    """A template that renders tools takes them; a reply in a format we do not know comes back as content."""
    return "tools" in capabilities(model)


def thinking_tags(model: LoadedModel) -> tuple[str, str] | None:
    """The model's (open, close) reasoning markers, None where its template teaches none."""
    return tpl.thinking_tags(template_of(model), architecture(model))


def always_thinks(model: LoadedModel) -> bool:
    """Whether the model's replies hold thinking whatever the request asks (gpt-oss, Apriel)."""
    fmt = formats.detect(template_of(model), architecture(model))
    return fmt is not None and (fmt.harmony or fmt.think_implicit)


def resolve_think(model: LoadedModel, think: bool | str | None) -> bool | str | None:
    """None/False: no thinking; a thinking-capable model defaults to on (as Ollama); 400 where unsupported."""
    capable = thinking_tags(model) is not None
    if isinstance(think, str) and think not in ("low", "medium", "high", "max"):
        raise APIError(400, f"invalid think value {think!r}: expected true, false, \"low\", \"medium\", \"high\" or \"max\"")
    if think is None:
        return True if capable else None
    if think and not capable:
        raise APIError(400, f'"{model.name}" does not support thinking')
    return think if capable else None


_preserved: "weakref.WeakKeyDictionary[Any, dict[tuple[str, str | None], dict[int, bytes]]]" = \
    weakref.WeakKeyDictionary()


def preserved_tokens(model: LoadedModel) -> dict[int, bytes]:
    """The special tokens that carry the model's reply structure (harmony's `<|channel|>`, Kimi's section
    markers...), id -> their text: the engine emits that text, which the detokenizer would otherwise hide, so the
    reply parser sees them. Cached per tokenizer, template and architecture."""
    template, arch = template_of(model) or "", architecture(model)
    tok = model.runner.tokenizer
    try:
        per_tok = _preserved.setdefault(tok, {})
    except TypeError:  # not weak-referenceable: compute each time
        per_tok = {}
    key = (template, arch)
    if key not in per_tok:
        fmt = formats.detect(template, arch)
        if len(per_tok) > 16:
            per_tok.clear()
        per_tok[key] = structure_tokens(tok, fmt.markers() if fmt else formats.THINK)
    return per_tok[key]


def structure_tokens(tok: Any, markers: tuple[str, ...]) -> dict[int, bytes]:
    """Of `markers`, those that are one special token whose text the tokenizer hides: id -> text. A marker the
    vocabulary spells as plain text needs nothing, and an end-of-generation token ends the reply instead
    (the parser takes the end of the output as its end: gpt-oss's `<|call|>`)."""
    found: dict[int, bytes] = {}
    for marker in markers:
        try:
            ids = tok.encode(marker, add_special=False, parse_special=True)
        except Exception:  # noqa: BLE001 - a tokenizer that cannot encode it has no such token
            continue
        text = marker.encode("utf-8")
        if len(ids) == 1 and ids[0] not in tok.eos_ids and tok.token_bytes(ids[0]) != text:
            found[ids[0]] = text
    return found


def _special_text(model: LoadedModel, token_id: int | None) -> str:
    if token_id is None:
        return ""
    try:
        return model.runner.tokenizer.id_to_piece(token_id) or ""
    except Exception:  # noqa: BLE001 - a tokenizer without that id simply has no text for it
        return ""


def _eos_text(model: LoadedModel) -> str:
    return model.record.eos_token or _special_text(model, model.runner.tokenizer.eos_id)


def _bos_text(model: LoadedModel) -> str:
    # The tokenizer adds BOS itself (encode drops a BOS the template wrote), so `{{ bos_token }}` is harmless.
    return model.record.bos_token or _special_text(model, model.runner.tokenizer.bos_id)


def _budget(max_chars: int | None) -> tpl.Budget:
    """A render's budget; with `max_chars` (the most a prompt that fits can have) its output stops there."""
    return tpl.Budget(max_output=min(tpl.MAX_OUTPUT, max_chars)) if max_chars is not None else tpl.Budget()


def _over(budget: tpl.Budget, max_chars: int | None) -> bool:
    """Whether a budget error was the prompt outgrowing `max_chars` (not a runaway template)."""
    return max_chars is not None and budget.max_output == max_chars and budget.output > max_chars


def render_chat(model: LoadedModel, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None,
                think: bool | str | None, window: int | None = None,
                max_chars: int | None = None) -> tuple[str, bool]:
    """The /api/chat prompt text, and whether the tokenizer should add BOS (the template never does here).
    With `max_chars` a prompt growing past it stops rendering there: a 400 saying it cannot fit `window`."""
    msgs = tpl.prepare_chat_messages(messages, model_system=model.record.system,
                                     model_messages=model.record.messages)
    budget = _budget(max_chars)
    try:
        text = tpl.render_messages(template_of(model), msgs, tools=tools, bos_token=_bos_text(model),
                                   eos_token=_eos_text(model), think=think, budget=budget, arch=architecture(model))
    except tpl.TemplateCancelled:
        raise
    except tpl.TemplateError as e:
        if _over(budget, max_chars) and window:
            raise prompt_size.too_long(model, window, max_chars) from None  # type: ignore[arg-type]
        raise APIError(400, f"cannot render the chat template of '{model.name}': {e}") from None
    return text, True


def render_generate(model: LoadedModel, prompt: str, *, system: str | None, suffix: str, template: str | None,
                    think: bool | str | None, window: int | None = None,
                    max_chars: int | None = None) -> tuple[str, bool]:
    budget = _budget(max_chars)
    try:
        text = tpl.render_generate(template or template_of(model), prompt, system=system,
                                   model_system=model.record.system, model_messages=model.record.messages,
                                   suffix=suffix or None, bos_token=_bos_text(model), eos_token=_eos_text(model),
                                   think=think, budget=budget, arch=architecture(model))
    except tpl.TemplateCancelled:
        raise
    except tpl.SuffixNotSupported:
        raise APIError(400, f"model '{model.name}' does not support insert (its template has no .Suffix)") from None
    except tpl.TemplateError as e:
        if _over(budget, max_chars) and window:
            raise prompt_size.too_long(model, window, max_chars) from None  # type: ignore[arg-type]
        raise APIError(400, f"cannot render the template of '{model.name}': {e}") from None
    return text, True


def encode(model: LoadedModel, text: str, *, add_special: bool) -> list[int]:
    """The prompt's ids, starting with one BOS where the model adds one, whether or not the template wrote it."""
    cancel.checkpoint()  # the render may have been long: its client may have gone since
    tok = model.runner.tokenizer
    bos = tok.bos_id
    if add_special and tok.add_bos:
        text = without_leading_bos(model, text)
    ids = list(tok.encode(text, add_special=add_special, parse_special=True))
    if add_special and bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]  # a BOS written some other way (its piece spelled differently, after whitespace)
    return ids


def without_leading_bos(model: LoadedModel, text: str) -> str:
    """`text` less the BOS a template wrote at its start, as llama-server does (common/chat.cpp): the tokenizer
    adds BOS, and handing llama.cpp both made it warn on every request that the prompt starts with 2 BOS tokens."""
    lead = _bos_text(model)
    if not lead or not text.startswith(lead):
        return text
    tok = model.runner.tokenizer
    if tok.encode(lead, add_special=False, parse_special=True) != [tok.bos_id]:
        return text  # the record's BOS text is not what this tokenizer reads as BOS: leave the prompt alone
    return text[len(lead):]
