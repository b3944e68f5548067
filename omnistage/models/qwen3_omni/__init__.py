"""Qwen3-Omni: thinker -> talker -> code2wav, or the thinker alone when audio is off.

    stage 0 "thinker"  (ar)          text/audio/image/video in -> text (MoE), and per position the
                                     hidden state and input embedding the talker reads
    stage 1 "talker"   (ar)          thinker states, streamed as the thinker makes them
                                     -> codec frames (MoE talker + code
                                     predictor: G codebooks per frame), streamed in chunks
    stage 2 "code2wav" (generation)  frames -> 24 kHz waveform (causal, streamed)

Every stage loads from the one full checkpoint (thinker.* / talker.* / code2wav.*). The
thinker-only variant serves checkpoints with `enable_audio_output: false` and deploys
whose `output_modalities` leave out audio. The voice is `prompt["voice"]` (a name of the
talker config's `speaker_id`, any case, default "Ethan"); chunking is `Code2WavParams`.

The recipe's shared pieces are `models.qwen_omni`'s; video parts are read on its PIL/numpy path
(`qwen_omni.video`: transformers 5's video processors are torchvision-only); `use_audio_in_video`
takes text output only (see the thinker).
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, register_pipeline
from omnistage.generation.decoder import register_decoder
from omnistage.models.qwen3_omni.params import Code2WavParams
from omnistage.models.qwen3_omni.processors import talker_chunks, talker_inputs, thinker_chunks, thinker_inputs
from omnistage.models.qwen_omni.recipe import QwenOmni, audio_wanted
from omnistage.models.speech_support import SpeechSupport, declare_speech

__all__ = ["QWEN3_OMNI_WHOLE_HANDOFF", "Code2WavParams", "resolve_qwen3_omni"]

# The reference generate()'s talker sampling defaults; max_tokens None = up to max_model_len.
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05, "max_tokens": None}

RECIPE = QwenOmni("qwen3_omni", "code2wav", thinker_inputs, thinker_chunks, talker_inputs, talker_chunks, TALKER_SAMPLING)
THINKER_STAGE, TALKER_STAGE, CODE2WAV_STAGE = RECIPE.stages()
QWEN3_OMNI, QWEN3_OMNI_WHOLE_HANDOFF, QWEN3_OMNI_THINKER_ONLY = RECIPE.pipelines()
# Streamed; the whole hand-off (`Omni(path, pipeline=QWEN3_OMNI_WHOLE_HANDOFF)`: the talker starts once the
# thinker has finished, the same tokens and audio under greedy decoding, later); the thinker alone.


def resolve_qwen3_omni(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
    """The three-stage pipeline, or the thinker alone when no audio is wanted or possible."""
    return QWEN3_OMNI if audio_wanted(files, deploy) else QWEN3_OMNI_THINKER_ONLY


register_ar_model("qwen3_omni.thinker", "omnistage.models.qwen3_omni.thinker:Qwen3OmniThinker")
register_ar_model("qwen3_omni.talker", "omnistage.models.qwen3_omni.talker:Qwen3OmniTalker")
register_decoder("qwen3_omni.code2wav", "omnistage.models.qwen3_omni.code2wav:Code2Wav")
register_pipeline("qwen3_omni_moe", resolve_qwen3_omni, deploy_config="qwen3_omni.yaml")
register_pipeline("Qwen3OmniMoeForConditionalGeneration", resolve_qwen3_omni, deploy_config="qwen3_omni.yaml")
declare_speech("qwen3_omni_moe", SpeechSupport(
    "Qwen3-Omni", "chat", preset="the checkpoint's speakers (e.g. `Ethan`, any case) in `audio.voice`"))
