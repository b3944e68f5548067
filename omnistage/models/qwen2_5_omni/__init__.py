"""Qwen2.5-Omni: thinker -> talker -> token2wav, or the thinker alone when audio is off.

    stage 0 "thinker"   (ar)          text/audio in -> text, and per position the hidden
                                      states and input embeddings the talker reads
    stage 1 "talker"    (ar)          thinker states, streamed as the thinker makes them
                                      -> codec tokens, streamed in chunks
    stage 2 "token2wav" (generation)  codec chunks -> 24 kHz waveform (DiT + BigVGAN)

Every stage loads from the one full checkpoint (thinker.* / talker.* / token2wav.*). The
thinker-only variant serves checkpoints with `enable_audio_output: false` and deploys
whose `output_modalities` leave out audio. The voice is `prompt["voice"]` (a name in
`spk_dict.pt`, default "Chelsie"); token2wav knobs are `Token2WavParams`. The recipe's shared
pieces (thinker inputs, the hand-off variants, media and video input) are `models.qwen_omni`'s.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, register_pipeline
from omnistage.generation.decoder import register_decoder
from omnistage.models.qwen2_5_omni.params import Token2WavParams
from omnistage.models.qwen2_5_omni.processors import talker_chunks, talker_inputs, thinker_chunks, thinker_inputs
from omnistage.models.qwen_omni.recipe import QwenOmni, audio_wanted
from omnistage.models.speech_support import SpeechSupport, declare_speech

__all__ = ["QWEN2_5_OMNI_WHOLE_HANDOFF", "Token2WavParams", "resolve_qwen2_5_omni"]

# The reference generate()'s talker sampling defaults; max_tokens None = up to max_model_len
# (the reference's 4096 new tokens cannot fit a 4096-position talker after its prompt).
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05, "max_tokens": None}

RECIPE = QwenOmni("qwen2_5_omni", "token2wav", thinker_inputs, thinker_chunks, talker_inputs, talker_chunks,
                  TALKER_SAMPLING)
THINKER_STAGE, TALKER_STAGE, TOKEN2WAV_STAGE = RECIPE.stages()
QWEN2_5_OMNI, QWEN2_5_OMNI_WHOLE_HANDOFF, QWEN2_5_OMNI_THINKER_ONLY = RECIPE.pipelines()
# Streamed; the whole hand-off (`Omni(path, pipeline=QWEN2_5_OMNI_WHOLE_HANDOFF)`: the talker starts once the
# thinker has finished, the same tokens and audio under greedy decoding, later); the thinker alone.


def resolve_qwen2_5_omni(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
    """The three-stage pipeline, or the thinker alone when no audio is wanted or possible."""
    return QWEN2_5_OMNI if audio_wanted(files, deploy) else QWEN2_5_OMNI_THINKER_ONLY


register_ar_model("qwen2_5_omni.thinker", "omnistage.models.qwen2_5_omni.thinker:OmniThinker")
register_ar_model("qwen2_5_omni.talker", "omnistage.models.qwen2_5_omni.talker:OmniTalker")
register_decoder("qwen2_5_omni.token2wav", "omnistage.models.qwen2_5_omni.token2wav:Token2Wav")
register_pipeline("qwen2_5_omni", resolve_qwen2_5_omni, deploy_config="qwen2_5_omni.yaml")
register_pipeline("Qwen2_5OmniForConditionalGeneration", resolve_qwen2_5_omni, deploy_config="qwen2_5_omni.yaml")
declare_speech("qwen2_5_omni", SpeechSupport("Qwen2.5-Omni", "chat",
                                             preset="the checkpoint's speakers (`Chelsie`, `Ethan`) in `audio.voice`"))
