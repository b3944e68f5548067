"""Qwen2.5-Omni: thinker -> talker -> token2wav, or the thinker alone when audio is off.

    stage 0 "thinker"   (ar)          text/audio in -> text, and per position the hidden
                                      states and input embeddings the talker reads
    stage 1 "talker"    (ar)          thinker states, streamed as the thinker makes them
                                      -> codec tokens, streamed in chunks
    stage 2 "token2wav" (generation)  codec chunks -> 24 kHz waveform (DiT + BigVGAN)

Every stage loads from the one full checkpoint (thinker.* / talker.* / token2wav.*). The
thinker-only variant serves checkpoints with `enable_audio_output: false` and deploys
whose `output_modalities` leave out audio. The voice is `prompt["voice"]` (a name in
`spk_dict.pt`, default "Chelsie"); token2wav knobs are `Token2WavParams`.
"""

import dataclasses

from omnistage.ar.model import register_ar_model
from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, StageSpec, register_pipeline
from omnistage.generation.decoder import register_decoder
from omnistage.models.qwen2_5_omni.params import Token2WavParams
from omnistage.models.qwen2_5_omni.processors import (
    TALKER,
    THINKER,
    TOKEN2WAV,
    talker_chunks,
    talker_inputs,
    talker_stream_inputs,
    thinker_chunks,
    thinker_inputs,
    thinker_only_inputs,
)

__all__ = ["QWEN2_5_OMNI_WHOLE_HANDOFF", "Token2WavParams", "resolve_qwen2_5_omni"]

# The reference generate()'s talker sampling defaults; max_tokens None = up to max_model_len
# (the reference's 4096 new tokens cannot fit a 4096-position talker after its prompt).
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "repetition_penalty": 1.05, "max_tokens": None}

THINKER_STAGE = StageSpec(
    id=THINKER, name="thinker", kind="ar", output="text", final_output=True,
    model="qwen2_5_omni.thinker", input_processor=thinker_inputs, chunk_processor=thinker_chunks,
)
TALKER_STAGE = StageSpec(
    id=TALKER, name="talker", kind="ar", output="tokens", inputs=(THINKER,), stream_input=True,
    model="qwen2_5_omni.talker", input_processor=talker_stream_inputs, chunk_processor=talker_chunks,
    defaults={"default_sampling_params": TALKER_SAMPLING},
)
TOKEN2WAV_STAGE = StageSpec(
    id=TOKEN2WAV, name="token2wav", kind="generation", output="audio", inputs=(TALKER,), final_output=True,
    model="qwen2_5_omni.token2wav", stream_input=True,
)

QWEN2_5_OMNI = PipelineSpec(name="qwen2_5_omni", stages=(THINKER_STAGE, TALKER_STAGE, TOKEN2WAV_STAGE))


def whole_handoff(name: str, thinker: StageSpec, talker: StageSpec, vocoder: StageSpec,
                  whole_inputs) -> PipelineSpec:
    """An omni pipeline whose talker starts from the thinker's finished output (`whole_inputs`)
    instead of following its stream: the same greedy output, later. Shared by the Qwen omni families."""
    return PipelineSpec(name=name, stages=(
        dataclasses.replace(thinker, chunk_processor=None),
        dataclasses.replace(talker, stream_input=False, input_processor=whole_inputs), vocoder))


def audio_wanted(files: ModelFiles, deploy: PipelineDeployConfig) -> bool:
    """Whether an omni checkpoint can speak and the deploy wants it to (else the thinker runs alone)."""
    audio_in_checkpoint = (files.config or {}).get("enable_audio_output", True)
    return audio_in_checkpoint and (deploy.output_modalities is None or "audio" in deploy.output_modalities)


QWEN2_5_OMNI_WHOLE_HANDOFF = whole_handoff("qwen2_5_omni_whole_handoff", THINKER_STAGE, TALKER_STAGE,
                                           TOKEN2WAV_STAGE, talker_inputs)
"""The talker starts once the thinker has finished (`Omni(path, pipeline=QWEN2_5_OMNI_WHOLE_HANDOFF)`):
the same tokens and audio as the streamed hand-off under greedy decoding, later."""
QWEN2_5_OMNI_THINKER_ONLY = PipelineSpec(
    name="qwen2_5_omni_thinker_only",
    stages=(StageSpec(id=THINKER, name="thinker", kind="ar", output="text", final_output=True,
                      model="qwen2_5_omni.thinker", input_processor=thinker_only_inputs),),
    dropped_stages=(TALKER, TOKEN2WAV),
)


def resolve_qwen2_5_omni(files: ModelFiles, deploy: PipelineDeployConfig) -> PipelineSpec:
    """The three-stage pipeline, or the thinker alone when no audio is wanted or possible."""
    return QWEN2_5_OMNI if audio_wanted(files, deploy) else QWEN2_5_OMNI_THINKER_ONLY


register_ar_model("qwen2_5_omni.thinker", "omnistage.models.qwen2_5_omni.thinker:OmniThinker")
register_ar_model("qwen2_5_omni.talker", "omnistage.models.qwen2_5_omni.talker:OmniTalker")
register_decoder("qwen2_5_omni.token2wav", "omnistage.models.qwen2_5_omni.token2wav:Token2Wav")
register_pipeline("qwen2_5_omni", resolve_qwen2_5_omni, deploy_config="qwen2_5_omni.yaml")
register_pipeline("Qwen2_5OmniForConditionalGeneration", resolve_qwen2_5_omni, deploy_config="qwen2_5_omni.yaml")
