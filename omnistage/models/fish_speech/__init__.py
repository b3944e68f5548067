"""Fish Speech (fishaudio; OpenAudio S1's dual-AR line): text -> frames of codec codes.

    talker (ar)   text -> frames of `num_codebooks` codes: the slow transformer writes a semantic
                  token per frame, the fast one the frame's codebooks (talker.py, modeling.py)

The checkpoint folder is the one the authors' `fish-speech` loads: config.json ("model_type":
"dual_ar"), model.pth, tokenizer.tiktoken and special_tokens.json. The codec stage (the
authors' modded DAC in codec.pth) is not served yet, so no pipeline is registered: the talker
runs on the AR engine on its own (tests/models/test_fish_speech.py).

S2 Pro checkpoints ("model_type": "fish_qwen3_omni") are not read: they differ in layout
(sharded safetensors under `text_model.model.` / `audio_decoder.`, a transformers tokenizer)
and in generation (the fast transformer reads the normed slow state, tokens outside the
semantic range and `<|im_end|>` are masked, top-k and repetition-aware sampling), and the
authors publish that code (fish-speech 2.0) in their repository only, not on PyPI, so no
parity reference runs here.
"""

from omnistage.ar.model import register_ar_model

register_ar_model("fish_speech.talker", "omnistage.models.fish_speech.talker:FishSpeechTalker")
