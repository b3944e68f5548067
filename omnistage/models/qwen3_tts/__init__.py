"""Qwen3-TTS (12 Hz checkpoints): talker -> codec decoder, streamed.

    stage 0 "talker" (ar)          text (+ voice / instructions) -> codec frames: the talker
                                   picks codebook 0, the code predictor the rest (talker.py)
    stage 1 "codec"  (generation)  frames -> 24 kHz audio: the speech tokenizer's decoder,
                                   streamed in chunks (codec.py, sized by `Code2WavParams`)

The recipe is `models.talker_codec`'s, with Qwen3-Omni's talker loop and code2wav stream.

Both stages load the one checkpoint folder (the codec from its `speech_tokenizer/`). The
networks are transformers classes (modeling.py): no Qwen3-TTS code is needed at run time.
What a request may say, per checkpoint task (CustomVoice / VoiceDesign / Base voice
cloning): prompt.py; cloning's speaker embedding and reference codes: cloning.py.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, register_pipeline
from omnistage.diffusion.params import ExtraSpec
from omnistage.generation.decoder import register_decoder
from omnistage.models.qwen3_omni.params import Code2WavParams
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import TalkerCodec

__all__ = ["Code2WavParams", "resolve_qwen3_tts"]

# The authors' generation_config.json defaults (and `min_new_tokens=2` of their generate); a
# bare request speaks at most 750 frames (60 s at 12.5 frames/s), not max_model_len's minutes;
# a deploy file's default_sampling_params may raise it.
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05, "min_tokens": 2,
                   "max_tokens": 750}

TALKER_CODEC = TalkerCodec(talker="qwen3_tts.talker", codec="qwen3_tts.codec", sampling=TALKER_SAMPLING,
                           chunking=Code2WavParams())
STAGES = TALKER_CODEC.stages()


def resolve_qwen3_tts(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
    """The pipeline, with the checkpoint's speakers as the built-in voices (CustomVoice)."""
    config = files.config or {}
    speakers = tuple(name.lower() for name in ((config.get("talker_config") or {}).get("spk_id") or {}))
    extras = {
        "instructions": ExtraSpec(str, help="VoiceDesign: the voice described in words; CustomVoice (1.7B): style."),
        "language": ExtraSpec(str, default="auto", help="'auto' or a language of the checkpoint."),
        "task_type": ExtraSpec(str, help="CustomVoice, VoiceDesign or Base: must match the checkpoint."),
        "non_streaming_mode": ExtraSpec(bool, help="The authors' flag: the whole text in the prefill (default for "
                                                   "CustomVoice and VoiceDesign); false: a text token per frame."),
    }
    if speakers:
        extras["voice"] = ExtraSpec(str, default=speakers[0], choices=speakers,
                                    help="CustomVoice: a built-in speaker of the checkpoint.")
    if config.get("tts_model_type") == "base":
        extras["ref_audio"] = ExtraSpec(object, help="Base: the mono float clip to clone (with ref_sample_rate, and "
                                                     "its transcript in ref_text for in-context cloning).")
    return PipelineSpec(name="qwen3_tts", stages=STAGES, request_extras=extras)


register_ar_model("qwen3_tts.talker", "omnistage.models.qwen3_tts.talker:Qwen3TTSTalker")
register_decoder("qwen3_tts.codec", "omnistage.models.qwen3_tts.codec:Qwen3TTSCodec")
register_pipeline("qwen3_tts", resolve_qwen3_tts, deploy_config="qwen3_tts.yaml")  # config.json model_type
declare_speech("qwen3_tts", SpeechSupport(
    "Qwen3-TTS", "speech", preset="CustomVoice checkpoints: the checkpoint's speakers (e.g. `vivian`)",
    designed="VoiceDesign checkpoints: `instructions`",
    cloned="Base checkpoints: `ref_audio` (+ `ref_text`: in-context) or a registered voice"))
