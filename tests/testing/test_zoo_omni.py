"""The Qwen3-Omni zoo checkpoint: it loads in its reference class and generates text and audio.
That its builds are byte-deterministic and small test_zoo_speech.py checks, in the one fresh
process that rebuilds the AR / omni models."""

from __future__ import annotations

import torch

from omnistage.testing.omni_models import QWEN3_OMNI_GENERATE_KWARGS, QWEN3_OMNI_SAMPLE_RATE

SAMPLES_PER_FRAME = QWEN3_OMNI_SAMPLE_RATE * 2 // 25  # code2wav at 12.5 frames/s


def test_qwen3_omni_generates_text_and_audio(zoo):
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    path = zoo("qwen3-omni")
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(path).eval()
    assert model.dtype == torch.float32
    tok = AutoTokenizer.from_pretrained(path)
    inputs = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], add_generation_prompt=True,
                                     return_dict=True, return_tensors="pt")
    assert [tok.convert_ids_to_tokens(int(t)) for t in inputs["input_ids"][0, :2]] == ["<|im_start|>", "user"]
    with torch.inference_mode():
        ids, wav = model.generate(**inputs, **QWEN3_OMNI_GENERATE_KWARGS)
    assert ids.shape[1] > inputs["input_ids"].shape[1]
    frames = QWEN3_OMNI_GENERATE_KWARGS["talker_max_new_tokens"]
    assert 0 < wav.numel() <= frames * SAMPLES_PER_FRAME and wav.abs().max() > 0
