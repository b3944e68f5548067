"""Fish Speech (fishaudio; OpenAudio S1's dual-AR line): text -> frames of codec codes.

    talker (ar)   text -> frames of `num_codebooks` codes: the slow transformer writes a semantic
                  token per frame, the fast one the frame's codebooks (talker.py, modeling.py)

The checkpoint folder is the one the authors' `fish-speech` loads: config.json ("model_type":
"dual_ar"), model.pth, tokenizer.tiktoken and special_tokens.json. The codec stage (the
authors' modded DAC in codec.pth) is not served yet, so no pipeline is registered: the talker
runs on the AR engine on its own (tests/models/test_fish_speech.py).
"""

from omnistage.ar.model import register_ar_model

register_ar_model("fish_speech.talker", "omnistage.models.fish_speech.talker:FishSpeechTalker")
