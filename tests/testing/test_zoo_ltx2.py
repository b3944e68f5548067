"""The LTX-2 zoo model: its Gemma tokenizer is deterministic and Gemma-shaped, and the small
size is a few million parameters that diffusers' LTX2Pipeline loads and runs with audio."""

from __future__ import annotations

import numpy as np
import torch

from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.ltx2_models import build_gemma_tokenizer


def test_gemma_tokenizer_is_deterministic_and_left_padded():
    tokenizer = build_gemma_tokenizer()
    assert tokenizer.backend_tokenizer.to_str() == build_gemma_tokenizer().backend_tokenizer.to_str()
    assert type(tokenizer).__name__ == "GemmaTokenizer" and tokenizer.padding_side == "left"
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id] == [0, 1, 2]
    ids = tokenizer("a photo of a cat", padding="max_length", max_length=16).input_ids
    assert ids[0] == tokenizer.pad_token_id and tokenizer.unk_token_id not in ids
    # Characters outside the corpus fall back to bytes, never to <unk>.
    assert tokenizer.unk_token_id not in tokenizer("ünïcode ☃").input_ids


def test_small_builds_loads_and_makes_audio(zoo):
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(zoo("ltx2", size="small"))
    pipe.set_progress_bar_config(disable=True)
    num_params = sum(p.numel() for p in pipe.transformer.parameters())
    assert 1_000_000 < num_params < 10_000_000
    assert pipe.vae_spatial_compression_ratio == 16 and pipe.vae_temporal_compression_ratio == 4
    out = pipe(**dict(zoo_call_kwargs("ltx2", size="small"), num_inference_steps=2),
               generator=torch.Generator("cpu").manual_seed(0), output_type="np")
    assert out.frames.shape == (1, 9, 128, 128, 3) and np.isfinite(out.frames).all()
    assert out.audio.shape[:2] == (1, 2) and torch.isfinite(out.audio).all()
