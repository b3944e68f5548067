"""Incremental detokenization: equals a full decode, holds back partial stop strings."""

from __future__ import annotations

from omnistage.ar.detokenizer import IncrementalDetokenizer

TEXT = "The quick brown fox. héllo 你好 world"


def stream(tok, ids, stop=(), prompt=()):
    d = IncrementalDetokenizer(tok, list(prompt), list(stop))
    deltas = []
    for t in ids:
        d.step(t)
        deltas.append(d.take_delta())
        if d.stopped:
            break
    d.flush()
    deltas.append(d.take_delta())
    return d, deltas


def test_matches_a_full_decode_including_multibyte(tokenizer):
    prompt = tokenizer("Hello world!")["input_ids"]
    ids = tokenizer(TEXT)["input_ids"] + tokenizer.convert_tokens_to_ids(["<|im_end|>"])
    d, deltas = stream(tokenizer, ids, prompt=prompt)
    assert d.text == "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not d.stopped


def test_stop_string_cuts_and_is_never_streamed(tokenizer):
    ids = tokenizer(TEXT)["input_ids"]
    d, deltas = stream(tokenizer, ids, stop=["fox", "zzz"])
    assert d.stopped and d.text == "The quick brown "
    assert "".join(deltas) == d.text
    assert all("f" not in x for x in deltas)  # the start of "fox" was held back, then cut


def test_invalid_utf8_tail_is_flushed_like_decode(tokenizer):
    (lone,) = tokenizer.convert_tokens_to_ids(["é"])  # a byte that is not valid UTF-8 on its own
    d, deltas = stream(tokenizer, [lone, lone])
    assert d.text == tokenizer.decode([lone, lone]) and "".join(deltas) == d.text
