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

Video parts are read on the PIL/numpy path of `qwen2_5_omni.video` (transformers 5's video
processors are torchvision-only); `use_audio_in_video` takes text output only (see the thinker).
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, StageSpec, register_pipeline
from omnistage.generation.decoder import register_decoder
from omnistage.models.qwen2_5_omni import audio_wanted, whole_handoff
from omnistage.models.qwen3_omni.params import Code2WavParams
from omnistage.models.qwen3_omni.processors import (
    CODE2WAV,
    TALKER,
    THINKER,
    talker_chunks,
    talker_inputs,
    talker_stream_inputs,
    thinker_chunks,
    thinker_inputs,
    thinker_only_inputs,
)

__all__ = ["QWEN3_OMNI_WHOLE_HANDOFF", "Code2WavParams", "resolve_qwen3_omni"]

# The reference generate()'s talker sampling defaults; max_tokens None = up to max_model_len.
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0, "repetition_penalty": 1.05, "max_tokens": None}

THINKER_STAGE = StageSpec(
    id=THINKER, name="thinker", kind="ar", output="text", final_output=True,
    model="qwen3_omni.thinker", input_processor=thinker_inputs, chunk_processor=thinker_chunks,
)
TALKER_STAGE = StageSpec(
    id=TALKER, name="talker", kind="ar", output="tokens", inputs=(THINKER,), stream_input=True,
    model="qwen3_omni.talker", input_processor=talker_stream_inputs, chunk_processor=talker_chunks,
    defaults={"default_sampling_params": TALKER_SAMPLING},
)
CODE2WAV_STAGE = StageSpec(
    id=CODE2WAV, name="code2wav", kind="generation", output="audio", inputs=(TALKER,), final_output=True,
    model="qwen3_omni.code2wav", stream_input=True,
)

QWEN3_OMNI = PipelineSpec(name="qwen3_omni", stages=(THINKER_STAGE, TALKER_STAGE, CODE2WAV_STAGE))
QWEN3_OMNI_WHOLE_HANDOFF = whole_handoff("qwen3_omni_whole_handoff", THINKER_STAGE, TALKER_STAGE, CODE2WAV_STAGE,
                                         talker_inputs)
"""The talker starts once the thinker has finished (`Omni(path, pipeline=QWEN3_OMNI_WHOLE_HANDOFF)`):
the same tokens and audio as the streamed hand-off under greedy decoding, later."""
QWEN3_OMNI_THINKER_ONLY = PipelineSpec(
    name="qwen3_omni_thinker_only",
    stages=(StageSpec(id=THINKER, name="thinker", kind="ar", output="text", final_output=True,
                      model="qwen3_omni.thinker", input_processor=thinker_only_inputs),),
    dropped_stages=(TALKER, CODE2WAV),
)


def resolve_qwen3_omni(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
    """The three-stage pipeline, or the thinker alone when no audio is wanted or possible."""
    return QWEN3_OMNI if audio_wanted(files, deploy) else QWEN3_OMNI_THINKER_ONLY


register_ar_model("qwen3_omni.thinker", "omnistage.models.qwen3_omni.thinker:Qwen3OmniThinker")
register_ar_model("qwen3_omni.talker", "omnistage.models.qwen3_omni.talker:Qwen3OmniTalker")
register_decoder("qwen3_omni.code2wav", "omnistage.models.qwen3_omni.code2wav:Code2Wav")
register_pipeline("qwen3_omni_moe", resolve_qwen3_omni, deploy_config="qwen3_omni.yaml")
register_pipeline("Qwen3OmniMoeForConditionalGeneration", resolve_qwen3_omni, deploy_config="qwen3_omni.yaml")
