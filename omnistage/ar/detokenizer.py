"""Incremental detokenization and stop strings for one sequence.

Text is decoded one token at a time with `tokenizers`' `DecodeStream` (it buffers
partial UTF-8 sequences), so a step costs O(1), not O(output length). When stop
strings are set, the last `max(len(stop)) - 1` characters are held back from the
stream until the request ends, so a client never sees the start of a stop string that
is then cut off.
"""

from __future__ import annotations

from typing import Any

_PRIME_TOKENS = 6  # prompt tokens fed to the stream first, so the first output token gets its leading space right


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True) -> None:
        from tokenizers.decoders import DecodeStream

        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(f"{type(tokenizer).__name__} has no `tokenizers` backend; "
                            "the AR engine needs a fast tokenizer")
        self._backend = backend
        self._stream = DecodeStream(ids=list(prompt_token_ids[-_PRIME_TOKENS:]),
                                    skip_special_tokens=skip_special_tokens)
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._text = ""  # everything decoded so far (truncated at a stop string)
        self._released = 0  # how much of _text has been handed out
        self._finished = False
        self._skip_special = skip_special_tokens
        self._pending: list[int] = []  # tokens the stream holds back (an incomplete UTF-8 sequence)
        self.stopped = False  # a stop string was found

    def step(self, token_id: int, check_stop: bool = True) -> None:
        if self.stopped:
            return
        piece = self._stream.step(self._backend, token_id)
        if piece is None:
            self._pending.append(token_id)
            return
        self._pending.clear()
        if not piece:
            return
        start = max(0, len(self._text) - self._holdback)
        self._text += piece
        if check_stop and self._stop:
            cut = min((i for i in (self._text.find(s, start) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                self._text = self._text[:cut]
                self.stopped = True

    def flush(self) -> None:
        """The request ended: release the held-back tail, including bytes that never formed
        valid UTF-8 (decoded with replacement characters, as `tokenizer.decode` does)."""
        if self._pending and not self.stopped:
            self._text += self._backend.decode(self._pending, skip_special_tokens=self._skip_special)
            self._pending.clear()
        self._finished = True

    def take_delta(self) -> str:
        """Text not handed out yet, minus the held-back tail while the request runs."""
        end = len(self._text) if self._finished else max(self._released, len(self._text) - self._holdback)
        delta = self._text[self._released:end]
        self._released = end
        return delta

    @property
    def text(self) -> str:
        """The text handed out so far."""
        return self._text[:self._released]
