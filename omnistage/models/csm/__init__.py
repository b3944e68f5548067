"""CSM (Sesame's conversational speech model): text -> speech, with built-in or cloned voices.

    stage 0 "talker" (ar)          text (+ a reference clip) -> codec frames: the backbone
                                   picks codebook 0, the depth decoder the rest (talker.py)
    stage 1 "codec"  (generation)  frames -> 24 kHz audio: the checkpoint's Mimi decoder,
                                   streamed (generation/mimi.py)

The recipe is `models.talker_codec`'s: the talker streams its frames to the codec in chunks
(sized by `CsmCodecParams`), so the first audio leaves after the first few frames. Both
stages load the one CSM checkpoint. Prompts and voices: `prompt.py`.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, register_pipeline
from omnistage.diffusion.params import ExtraSpec
from omnistage.models.csm.params import CsmCodecParams
from omnistage.models.csm.prompt import BUILTIN_VOICES, DEFAULT_VOICE
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import TalkerCodec

__all__ = ["CSM", "CsmCodecParams"]

# The sampling the CSM model card uses. The checkpoint sets no length, and random or unlucky
# sampling may never reach EOS: a bare request speaks at most 750 frames (60 s at 12.5 frames/s),
# not max_model_len's minutes; a deploy file's default_sampling_params may raise it.
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 50, "max_tokens": 750}

TALKER_CODEC = TalkerCodec(talker="csm.talker", codec="mimi", sampling=TALKER_SAMPLING, chunking=CsmCodecParams())

CSM = PipelineSpec(
    name="csm",
    stages=TALKER_CODEC.stages(),
    request_extras={
        "voice": ExtraSpec(str, default=DEFAULT_VOICE, choices=tuple(BUILTIN_VOICES),
                           help="Built-in voice: a named CSM speaker id."),
        "ref_audio": ExtraSpec(object, help="Voice cloning: a mono float reference clip (with ref_sample_rate, "
                                            "and its transcript in ref_text)."),
    },
)

register_ar_model("csm.talker", "omnistage.models.csm.talker:CsmTalker")
register_pipeline("csm", CSM, deploy_config="csm.yaml")  # CSM checkpoints' config.json model_type
declare_speech("csm", SpeechSupport("CSM", "speech", preset=", ".join(f"`{v}`" for v in BUILTIN_VOICES),
                                    cloned="`ref_audio` (+ `ref_text`) or a registered voice"))
