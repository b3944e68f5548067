"""Higgs-Audio v2 (Boson AI): text (+ a scene description) -> speech.

    stage 0 "talker" (ar)          text (+ a clip to clone) -> codec frames: the DualFFN Llama emits all N
                                   codebooks per step in a delay pattern, undelayed into
                                   frames as they complete (talker.py)
    stage 1 "codec"  (generation)  frames -> 24 kHz audio: the audio tokenizer's DAC decoder,
                                   streamed with a lookahead (codec.py)

The recipe is `models.talker_codec`'s: the talker streams its frames to the codec in chunks
(CSM's sizes by default; `FrameChunkParams` as the request's "codec" params). The talker loads the checkpoint folder;
the codec loads the audio tokenizer its `processor_config.json` names. Prompts: prompt.py.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, register_pipeline
from omnistage.diffusion.params import ExtraSpec
from omnistage.generation.decoder import register_decoder
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import FrameChunkParams, TalkerCodec

__all__ = ["HIGGS_AUDIO"]

# The model card's sampling (its serve-engine example); a bare request speaks at most 1500
# frames (60 s at 25 frames/s), not max_model_len's minutes; a deploy file's
# default_sampling_params may raise it.
TALKER_SAMPLING = {"temperature": 0.3, "top_k": 50, "top_p": 0.95, "max_tokens": 1500}

TALKER_CODEC = TalkerCodec(talker="higgs_audio.talker", codec="higgs_audio.codec", sampling=TALKER_SAMPLING,
                           chunking=FrameChunkParams(first_chunk_frames=2, chunk_frames=8))

HIGGS_AUDIO = PipelineSpec(
    name="higgs_audio",
    stages=TALKER_CODEC.stages(),
    request_extras={
        "instructions": ExtraSpec(str, help="The scene: how the recording sounds (default: a quiet room)."),
        "ref_audio": ExtraSpec(object, help="Voice cloning: a mono float clip (with ref_sample_rate, and its "
                                            "transcript in ref_text)."),
    },
)

register_ar_model("higgs_audio.talker", "omnistage.models.higgs_audio.talker:HiggsAudioTalker")
register_decoder("higgs_audio.codec", "omnistage.models.higgs_audio.codec:HiggsCodec")
register_pipeline("higgs_audio_v2", HIGGS_AUDIO, deploy_config="higgs_audio.yaml")  # config.json model_type
# `instructions` is the scene (how the recording sounds), not the voice.
declare_speech("higgs_audio_v2", SpeechSupport("Higgs-Audio v2", "speech",
                                               cloned="`ref_audio` (+ `ref_text`) or a registered voice"))
