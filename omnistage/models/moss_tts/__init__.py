"""MOSS-TTS (OpenMOSS; the authors' minimal runtime is `moss-tts-lite`): text -> speech.

    stage 0 "talker" (ar)          text (+ a language, a described voice) -> frames of 32 codes:
                                   a Qwen3 backbone reads text and 32 codebooks summed and
                                   writes them in a delay pattern (talker.py, modeling.py)
    stage 1 "codec"  (generation)  frames -> 24 kHz audio: MOSS-Audio-Tokenizer's causal
                                   transformer decoder, streamed (codec.py)

The recipe is `models.talker_codec`'s: the talker streams its frames to the codec in chunks
(sized by `FrameChunkParams` as the request's "codec" params). Both stages load the checkpoint folder the
authors' package loads, with the audio tokenizer in its `MOSS-Audio-Tokenizer/` folder.
Prompts and voices: prompt.py.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, register_pipeline
from omnistage.diffusion.params import ExtraSpec
from omnistage.generation.decoder import register_decoder
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import TalkerCodec

__all__ = ["MOSS_TTS"]

# The authors' audio sampling defaults; a bare request speaks at most 4096 steps (the
# authors' max_new_tokens: about 5 minutes at 12.5 frames/s).
TALKER_SAMPLING = {"temperature": 1.7, "top_p": 0.8, "top_k": 25, "max_tokens": 4096}

TALKER_CODEC = TalkerCodec(talker="moss_tts.talker", codec="moss_tts.codec", sampling=TALKER_SAMPLING)

MOSS_TTS = PipelineSpec(
    name="moss_tts",
    stages=TALKER_CODEC.stages(),
    request_extras={
        "language": ExtraSpec(str, help="The spoken language as the model card names it (e.g. 'English', "
                                        "'Chinese'): the prompt's Language field."),
        "instructions": ExtraSpec(str, help="The voice and style described in words: the prompt's Instruction "
                                            "field."),
    },
)

register_ar_model("moss_tts.talker", "omnistage.models.moss_tts.talker:MossTTSTalker")
register_decoder("moss_tts.codec", "omnistage.models.moss_tts.codec:MossCodec")
register_pipeline("moss_tts_delay", MOSS_TTS, deploy_config="moss_tts.yaml")
# Cloning needs the audio tokenizer's encoder, which the authors' moss-tts-lite does not ship.
declare_speech("moss_tts_delay", SpeechSupport("MOSS-TTS", "speech", designed="`instructions`"))
