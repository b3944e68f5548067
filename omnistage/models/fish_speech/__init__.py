"""Fish Speech (fishaudio; OpenAudio S1's dual-AR line): text -> speech.

    stage 0 "talker" (ar)          text -> frames of `num_codebooks` codes: the slow transformer
                                   writes a semantic token per frame, the fast one the frame's
                                   codebooks (talker.py, modeling.py)
    stage 1 "codec"  (generation)  frames -> 44.1 kHz audio: the authors' modded DAC decoder
                                   (codec.pth), streamed (codec.py)

The recipe is `models.talker_codec`'s: the talker streams its frames to the codec in chunks
(sized by `FrameChunkParams` as the request's "codec" params). Both stages load the folder the
authors' `fish-speech` loads: config.json ("model_type": "dual_ar"), model.pth,
tokenizer.tiktoken, special_tokens.json and codec.pth. The talker samples as the authors do
(temperature, top-p, repetition penalty over a window); sampling params their sampler has no
place for are refused by name (talker.py). No built-in voices; cloning needs the codec's
encoder, which is not served.

S2 Pro checkpoints ("model_type": "fish_qwen3_omni") are not read: they differ in layout
(sharded safetensors under `text_model.model.` / `audio_decoder.`, a transformers tokenizer)
and in generation (the fast transformer reads the normed slow state, tokens outside the
semantic range and `<|im_end|>` are masked, top-k and repetition-aware sampling), and the
authors publish that code (fish-speech 2.0) in their repository only, not on PyPI, so no
parity reference runs here.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, register_pipeline
from omnistage.generation.decoder import register_decoder
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import TalkerCodec

__all__ = ["FISH_SPEECH"]

# The authors' defaults (their TTS request: temperature, top-p and repetition penalty 0.8,
# 0.8, 1.1; max_new_tokens 1024 frames, about 48 s at 44100 / 2048 frames/s).
TALKER_SAMPLING = {"temperature": 0.8, "top_p": 0.8, "repetition_penalty": 1.1, "max_tokens": 1024}

TALKER_CODEC = TalkerCodec(talker="fish_speech.talker", codec="fish_speech.codec", sampling=TALKER_SAMPLING)

FISH_SPEECH = PipelineSpec(name="fish_speech", stages=TALKER_CODEC.stages())

register_ar_model("fish_speech.talker", "omnistage.models.fish_speech.talker:FishSpeechTalker")
register_decoder("fish_speech.codec", "omnistage.models.fish_speech.codec:FishCodec")
register_pipeline("dual_ar", FISH_SPEECH, deploy_config="fish_speech.yaml")  # config.json model_type
# Cloning needs the codec's encoder, which is not served.
declare_speech("dual_ar", SpeechSupport("Fish Speech (OpenAudio S1)", "speech"))
