"""Streaming detokenisation and stop strings, O(new bytes) per token.

Tokens map to raw bytes (random weights emit lone UTF-8 continuation bytes freely); an incremental UTF-8
decoder holds back an incomplete character until it completes, and never re-decodes what was emitted.
Stop strings are matched on the text across token boundaries: a suffix that could start a stop string
is held back until disambiguated, and a matched stop string is never emitted.
"""
from __future__ import annotations

import codecs


class IncrementalDetokenizer:
    def __init__(self, stop: list[str] | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in (stop or []) if s]
        self._held = ""  # decoded text that might be the start of a stop string
        self.stopped = False
        self.text_len = 0  # characters emitted so far

    def add(self, piece: bytes) -> str:
        """Feed one token's bytes; returns text that is safe to emit now."""
        if self.stopped:
            return ""
        text = self._decoder.decode(piece, final=False)
        return self._emit(text)

    def flush(self) -> str:
        """End of stream: incomplete bytes become U+FFFD; held text is emitted (no stop string matched)."""
        if self.stopped:
            return ""
        text = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        self.text_len += len(text)
        return text

    def _emit(self, text: str) -> str:
        if not self.stop:
            self.text_len += len(text)
            return text
        buf = self._held + text
        first = -1
        for s in self.stop:
            i = buf.find(s)
            if i != -1 and (first == -1 or i < first):
                first = i
        if first != -1:
            self.stopped = True
            self._held = ""
            self.text_len += first
            return buf[:first]
        hold = self._partial_suffix(buf)
        self._held = buf[len(buf) - hold:] if hold else ""
        out = buf[: len(buf) - hold]
        self.text_len += len(out)
        return out

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
