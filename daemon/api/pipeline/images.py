"""Images in requests: base64 / data URLs to checked bytes, Ollama's `[img-N]` tags in the prompt, and the
rendered prompt turned into the backend's multimodal prompt (tokens + image embedding spans).

Checks here need no decoder: size and count limits, the format from its magic bytes (PNG, JPEG, GIF, BMP) and
the pixel size from its header, so a decompression bomb or a non-image is a 400 before any decoder sees it."""
from __future__ import annotations

import base64
import binascii
import re
import struct
from typing import Any

from ....backends.base import ImageInputError, MultimodalPrompt
from ....backends.registry import specs
from ..http.errors import APIError

MAX_IMAGES = 16  # per request
MAX_IMAGE_BYTES = 20 << 20  # one image, decoded
MAX_SIDE = 8192  # pixels, each side
MAX_PIXELS = 40_000_000
_TAG = re.compile(r"\[img-(\d+)\]")
_DATA_URL = re.compile(r"data:([\w/+.-]*)(;[\w=.-]+)*;base64,", re.IGNORECASE)


def decode_image(value: Any, where: str) -> bytes:
    """One image (base64, or a data: URL) -> checked bytes; APIError 400 naming `where` otherwise."""
    if not isinstance(value, str):
        raise APIError(400, f"invalid image in {where}: expected a base64 string, got {type(value).__name__}")
    if value.startswith(("http://", "https://")):
        raise APIError(400, f"invalid image in {where}: remote image URLs are not fetched; send the image as a "
                            "base64 data URL (data:image/png;base64,...)")
    m = _DATA_URL.match(value)
    if value.startswith("data:") and m is None:
        raise APIError(400, f"invalid image in {where}: a data URL must be base64 (data:image/png;base64,...)")
    text = value[m.end():] if m else value
    if len(text) > (MAX_IMAGE_BYTES * 4) // 3 + 8:
        raise APIError(400, f"image in {where} is too large: the limit is {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, f"invalid image in {where}: not valid base64") from None
    if not data:
        raise APIError(400, f"invalid image in {where}: empty")
    fmt, size = image_size(data)
    if fmt is None:
        raise APIError(400, f"invalid image in {where}: not a PNG, JPEG, GIF or BMP image")
    if size is None:
        raise APIError(400, f"invalid image in {where}: a truncated or corrupt {fmt} header")
    w, h = size
    if not (0 < w <= MAX_SIDE and 0 < h <= MAX_SIDE) or w * h > MAX_PIXELS:
        raise APIError(400, f"image in {where} is {w}x{h} pixels; the limit is {MAX_SIDE} per side and "
                            f"{MAX_PIXELS // 1_000_000} megapixels")
    return data


def decode_images(values: list[Any] | None, where: str, count: int = 0) -> list[bytes]:
    """A list of images; `count` images of the request came before (the limit is per request)."""
    values = values or []
    if count + len(values) > MAX_IMAGES:
        raise APIError(400, f"too many images: at most {MAX_IMAGES} per request")
    return [decode_image(v, f"{where}[{i}]") for i, v in enumerate(values)]


def image_size(data: bytes) -> tuple[str | None, tuple[int, int] | None]:
    """(format, (width, height)) from the header; (None, None) for an unknown format, (fmt, None) if corrupt."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        if len(data) >= 24 and data[12:16] == b"IHDR":
            return "PNG", struct.unpack(">II", data[16:24])
        return "PNG", None
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF", struct.unpack("<HH", data[6:10]) if len(data) >= 10 else None
    if data.startswith(b"BM"):
        if len(data) >= 26:
            w, h = struct.unpack("<ii", data[18:26])
            return "BMP", (abs(w), abs(h))
        return "BMP", None
    if data.startswith(b"\xff\xd8"):
        return "JPEG", _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise APIError(400, "WebP images are not supported by the llama.cpp image decoder; send PNG or JPEG")
    return None, None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if i + 9 > len(data):
                return None
            h, w = struct.unpack(">HH", data[i + 5:i + 9])
            return w, h
        i += 2 + length
    return None


def tag_messages(messages: list[dict[str, Any]], images: list[list[bytes]]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Ollama's chat prompt: each image of a message is `[img-N] ` before its content (N counts over the chat),
    or replaces an `[img]` the content holds."""
    out, flat = [], []
    for m, imgs in zip(messages, images):
        if imgs:
            m = dict(m)
            content = m.get("content") or ""
            for img in imgs:
                tag = f"[img-{len(flat)}]"
                flat.append(img)
                content = content.replace("[img]", tag, 1) if "[img]" in content else tag + " " + content
            m["content"] = content
        out.append(m)
    return out, flat


def count_tags(text: str, n_images: int) -> int:
    """The images a rendered prompt holds: its `[img-N]` tags that name one of the request's `n_images`."""
    return sum(1 for m in _TAG.finditer(text) if int(m.group(1)) < n_images)


def build_prompt(model: Any, text: str, images: list[bytes], add_special: bool) -> MultimodalPrompt:
    """The rendered prompt's `[img-N]` tags as the backend's image marker, tokenized with the images encoded
    (here, in the prepare worker). An image the template dropped (an old turn cut) is not sent."""
    vision = model.runner.vision
    used: list[bytes] = []

    def sub(m: re.Match) -> str:
        n = int(m.group(1))
        if n >= len(images):
            return m.group(0)
        used.append(images[n])
        return vision.marker

    marked = _TAG.sub(sub, text.replace(vision.marker, " "))  # a marker typed by the user is not an image
    try:
        mm = vision.build_prompt(marked, used, add_special)
    except ImageInputError as e:
        raise APIError(400, str(e)) from None
    cap = model.engine.scheduler.config.max_step_tokens
    if cap and any(not e.causal and len(e.rows) > cap for e in mm.embeds):  # such an image runs in one step
        raise APIError(400, f"an image of this model takes more than {cap} positions, the most one step holds; "
                            "raise EVENFLOW_MAX_BATCHED_TOKENS")
    return mm


def check_vision(model: Any, name: str) -> None:
    """400 for a model without vision (Ollama's wording), 501 naming the fix where its projector cannot load here."""
    if model.runner.vision is not None:
        return
    if model.record.projector:
        vision = [s for s in specs() if s.vision]
        reason = model.runner.vision_error or (f"the {model.backend} backend does not run vision models; the "
                                               f"{' and '.join(s.title for s in vision)} backend does "
                                               f"(EVENFLOW_BACKEND={vision[0].name})")
        raise APIError(501 if model.runner.vision_error else 400, f"model '{name}' cannot take images here: {reason}")
    raise APIError(400, f"model '{name}' does not support images")
