"""Images in on llama.cpp: libmtmd's vision tower, run by the prepare workers, never by the engine thread.

How an image reaches the model (and why):
- The prepare step (a worker thread, off the event loop) renders the prompt with one `mtmd_default_marker()` per
  image, and `build_prompt` splits it there, tokenizes the text and ENCODES each image here: the clip context is a
  ggml graph of its own (own backend, own threads), separate from the llama context the engine thread decodes
  with, so an encode never waits for a step nor a step for an encode. One lock serialises this mtmd context.
- The image becomes a span of prompt positions given as embedding rows (`base.EmbedSpan`). Its "token ids" are
  placeholders derived from the SHA-256 of the image's bytes and the row's index (negative, so never a vocab id),
  as llama-server does: the engine's prefix-cache block hash chain then tells images apart, and a second question
  about the same image reuses the KV of its span (and `_cache` spares the encode itself).
- The scheduler chunks that span like text (a LLaVA-style model's image attention is causal); a projector whose
  image rows attend each other both ways (`mtmd_decode_use_non_causal`, e.g. Gemma 3) marks the span non-causal and
  the scheduler places it whole. A llama_batch carries tokens OR embeddings, so a step holding image rows runs
  them in llama_decode calls of their own over the same KV (vision_decode.py), as mtmd_helper_decode_image_chunk
  does. M-RoPE projectors (Qwen2-VL family: 4 positions per row) are refused at load: not supported yet.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import threading
from collections import OrderedDict

import numpy as np

from ..base import ImageInputError, ModelLoadError, MultimodalPrompt, EmbedSpan, VisionEncoder
from . import native
from .native import take_recent_errors

log = logging.getLogger(__name__)

MTMD_MISSING = ("this llama-cpp-python build has no libmtmd (it was built with -DLLAVA_BUILD=OFF), which vision "
                "models need; rebuild it with: CMAKE_ARGS=\"-DLLAVA_BUILD=ON\" pip install --no-cache-dir "
                "--force-reinstall --no-deps llama-cpp-python (packaging/dev.sh does this)")
CACHE_BYTES = 256 << 20  # encoded images kept by hash (a 576-row image of a 4096-wide model is 9 MiB)


def mtmd_module():
    """llama_cpp.mtmd_cpp, or ModelLoadError naming the fix when this build lacks libmtmd."""
    try:
        from llama_cpp import mtmd_cpp  # noqa: PLC0415 - loads libmtmd, absent from some builds
    except (OSError, FileNotFoundError, RuntimeError) as e:
        raise ModelLoadError(f"{MTMD_MISSING} ({e})") from None
    return mtmd_cpp


def mtmd_available() -> bool:
    try:
        mtmd_module()
    except ModelLoadError:
        return False
    return True


def placeholder_ids(digest: bytes, n: int) -> list[int]:
    """The prompt ids of an image's n rows: negative (never a vocab id), from its hash (the prefix cache's key)."""
    h = int.from_bytes(digest[:7], "little")  # 56 bits: ids stay far inside int64
    return [-1 - ((h + j) & ((1 << 60) - 1)) for j in range(n)]


class LlamaCppVision(VisionEncoder):
    """A projector GGUF on libmtmd, tied to the text model it feeds."""

    def __init__(self, model, n_embd: int, projector_path: str, n_threads: int) -> None:
        self.M = M = mtmd_module()
        self.n_embd = n_embd
        log_callback = native.log_callback()
        if log_callback is not None:  # clip's and the helper's logs as llama.cpp's: DEBUG, errors quoted
            M.mtmd_log_set(log_callback, ctypes.c_void_p(0))
            M.mtmd_helper_log_set(log_callback, ctypes.c_void_p(0))
        params = M.mtmd_context_params_default()
        params.n_threads = n_threads
        params.print_timings = False
        params.warmup = False
        self._ctx = M.mtmd_init_from_file(projector_path.encode(), model, params)
        if not self._ctx:
            raise ModelLoadError(f"{projector_path}: libmtmd could not load the vision projector: "
                                 f"{take_recent_errors() or 'unsupported projector'}")
        if not M.mtmd_support_vision(self._ctx):
            self.close()
            raise ModelLoadError(f"{projector_path}: the projector has no vision encoder")
        if M.mtmd_decode_use_mrope(self._ctx):
            self.close()
            raise ModelLoadError(f"{projector_path}: M-RoPE vision models (Qwen2-VL family) are not supported yet")
        self.marker = M.mtmd_default_marker().decode()
        self._lock = threading.Lock()
        self._cache: OrderedDict[bytes, tuple[np.ndarray, bool]] = OrderedDict()
        self._cache_bytes = 0
        self.encodes = 0  # images run through the tower (tests and metrics: a cache hit does not count)

    def build_prompt(self, text: str, images: list[bytes], add_special: bool) -> MultimodalPrompt:
        pieces = text.split(self.marker)
        if len(pieces) - 1 != len(images):
            raise ImageInputError(f"the prompt holds {len(pieces) - 1} image markers ({self.marker}) but "
                                  f"{len(images)} images were given")
        with self._lock:
            if self._ctx is None:
                raise RuntimeError("the vision encoder is closed")
            return self._build(pieces, images, add_special)

    def _build(self, pieces: list[str], images: list[bytes], add_special: bool) -> MultimodalPrompt:
        M = self.M
        bitmaps, chunks = [], None
        keep: list = []  # ctypes objects the parts point into
        try:
            parts = []
            for i, piece in enumerate(pieces):
                if piece:
                    raw = piece.encode("utf-8")
                    t = M.mtmd_input_text(raw, len(raw), add_special, True)
                    keep += [raw, t]
                    parts.append(M.mtmd_input_part(ctypes.pointer(t), None))
                if i < len(images):
                    buf = (ctypes.c_uint8 * len(images[i])).from_buffer_copy(images[i])
                    bm = M.mtmd_helper_bitmap_init_from_buf(self._ctx, buf, len(images[i]), False)
                    if not bm or M.mtmd_bitmap_is_audio(bm):
                        if bm:
                            M.mtmd_bitmap_free(bm)
                        raise ImageInputError(f"image {i + 1} could not be decoded: "
                                              f"{take_recent_errors() or 'not a supported image'}")
                    bitmaps.append(bm)
                    parts.append(M.mtmd_input_part(None, bm))
            arr = (ctypes.POINTER(M.mtmd_input_part) * len(parts))(*[ctypes.pointer(p) for p in parts])
            chunks = M.mtmd_input_chunks_init()
            rc = M.mtmd_tokenize_from_parts(self._ctx, chunks, arr, len(parts), add_special)
            if rc != 0:
                raise ImageInputError(f"the images could not be prepared for the model (mtmd error {rc}): "
                                      f"{take_recent_errors() or 'preprocessing failed'}")
            return self._collect(chunks)
        finally:
            if chunks:
                M.mtmd_input_chunks_free(chunks)
            for bm in bitmaps:
                M.mtmd_bitmap_free(bm)

    def _collect(self, chunks) -> MultimodalPrompt:
        M = self.M
        ids: list[int] = []
        embeds: list[EmbedSpan] = []
        encoded = 0
        for c in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, c)
            kind = M.mtmd_input_chunk_get_type(chunk)
            if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                ptr = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(ptr[: n.value] if n.value else [])
                continue
            if kind != M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise ImageInputError("only images are supported as media input")
            n = int(M.mtmd_input_chunk_get_n_tokens(chunk))
            # the helper names a bitmap by the SHA-256 of the image's bytes
            digest = hashlib.sha256((M.mtmd_input_chunk_get_id(chunk) or b"") + b":%d" % n).digest()
            rows, causal, fresh = self._rows(chunk, digest, n)
            encoded += fresh
            embeds.append(EmbedSpan(len(ids), rows, causal))
            ids.extend(placeholder_ids(digest, n))
        return MultimodalPrompt(ids, embeds, encoded)

    def _rows(self, chunk, digest: bytes, n: int) -> tuple[np.ndarray, bool, bool]:
        """The image's embedding rows: from the cache, else one encode through the vision tower."""
        hit = self._cache.get(digest)
        if hit is not None:
            self._cache.move_to_end(digest)
            return hit[0], hit[1], False
        M = self.M
        if M.mtmd_encode_chunk(self._ctx, chunk) != 0:
            raise ImageInputError(f"the vision encoder failed on an image: {take_recent_errors() or 'encode error'}")
        out = M.mtmd_get_output_embd(self._ctx)
        rows = np.ctypeslib.as_array(out, shape=(n * self.n_embd,)).reshape(n, self.n_embd).copy()
        rows.setflags(write=False)
        causal = not M.mtmd_decode_use_non_causal(self._ctx, chunk)
        self.encodes += 1
        self._cache[digest] = (rows, causal)
        self._cache_bytes += rows.nbytes
        while self._cache_bytes > CACHE_BYTES and len(self._cache) > 1:
            old, _ = self._cache.popitem(last=False)[1]
            self._cache_bytes -= old.nbytes
        return rows, causal, True

    def close(self) -> None:
        if self._ctx is not None:
            self.M.mtmd_free(self._ctx)
            self._ctx = None


def attach_vision(runner, projector_path: str) -> None:
    """Load the projector beside a loaded runner (runner.vision); on failure keep the text model and record why
    images cannot be served (runner.vision_error), so text requests still work."""
    from .lib import L  # noqa: PLC0415

    try:
        n_embd = int(L.llama_model_n_embd(runner.llama_model))
        # half the cores: an encode runs beside the engine's steps, which keep the rest
        runner.vision = LlamaCppVision(runner.llama_model, n_embd, projector_path, max(1, runner.n_threads // 2))
        runner.vision_error = None
        if runner.extra_bufts and runner.info.file_type == "F32":  # docs/bench/vision_bench.md
            log.warning("%s: an F32 model with llama.cpp's extra buffer types on: steps that carry image rows can "
                        "take ~1 s each on this CPU; set EVENFLOW_LLAMACPP_EXTRA_BUFTS=off", runner.path)
    except ModelLoadError as e:
        log.warning("vision projector not loaded: %s", e)
        runner.vision, runner.vision_error = None, str(e)
