"""The Qwen omni recipe, declared once for both families.

    stage 0 "thinker" (ar)          prompt -> text, and per position what the talker reads
    stage 1 "talker"  (ar)          the thinker's rows, streamed -> codec codes, streamed
    stage 2 vocoder   (generation)  codes -> waveform

A family declares its models' key prefix, its vocoder stage's name, its four stage
processors and the talker's sampling defaults (`QwenOmni`); it gets its stages and three
pipelines: streamed, the whole hand-off (the talker starts from the thinker's finished
output: the same greedy output, later) and the thinker alone, which its resolver picks
when `audio_wanted` says no. Torch-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from omnistage.config import ModelFiles, PipelineDeployConfig, PipelineSpec, StageSpec
from omnistage.models.qwen_omni.handoff import TALKER, THINKER, VOCODER, talker_stream_inputs, thinker_only_inputs


@dataclass(frozen=True)
class QwenOmni:
    family: str
    """The streamed pipeline's name and its models' key prefix (`{family}.thinker`, `.talker`, `.{vocoder}`)."""
    vocoder: str
    """The vocoder stage's name: the key of its params in a request."""
    thinker_inputs: Callable[..., Any]
    thinker_chunks: Callable[..., Any]
    """The thinker's rows as it makes them -> the talker's input so far (the streamed hand-off)."""
    talker_inputs: Callable[..., Any]
    """The thinker's finished output -> the talker's input (the whole hand-off)."""
    talker_chunks: Callable[..., Any]
    talker_sampling: Mapping[str, Any]

    def stages(self) -> tuple[StageSpec, StageSpec, StageSpec]:
        return (
            StageSpec(id=THINKER, name="thinker", kind="ar", output="text", final_output=True,
                      model=f"{self.family}.thinker", input_processor=self.thinker_inputs,
                      chunk_processor=self.thinker_chunks),
            StageSpec(id=TALKER, name="talker", kind="ar", output="tokens", inputs=(THINKER,), stream_input=True,
                      model=f"{self.family}.talker", input_processor=talker_stream_inputs,
                      chunk_processor=self.talker_chunks,
                      defaults={"default_sampling_params": dict(self.talker_sampling)}),
            StageSpec(id=VOCODER, name=self.vocoder, kind="generation", output="audio", inputs=(TALKER,),
                      final_output=True, model=f"{self.family}.{self.vocoder}", stream_input=True),
        )

    def pipelines(self) -> tuple[PipelineSpec, PipelineSpec, PipelineSpec]:
        """(streamed, whole hand-off, thinker only)."""
        thinker, talker, vocoder = self.stages()
        streamed = PipelineSpec(name=self.family, stages=(thinker, talker, vocoder))
        whole = PipelineSpec(name=f"{self.family}_whole_handoff", stages=(
            dataclasses.replace(thinker, chunk_processor=None),
            dataclasses.replace(talker, stream_input=False, input_processor=self.talker_inputs), vocoder))
        thinker_only = PipelineSpec(
            name=f"{self.family}_thinker_only",
            stages=(dataclasses.replace(thinker, chunk_processor=None, input_processor=thinker_only_inputs),),
            dropped_stages=(TALKER, VOCODER))
        return streamed, whole, thinker_only


def audio_wanted(files: ModelFiles, deploy: PipelineDeployConfig) -> bool:
    """Whether an omni checkpoint can speak and the deploy wants it to (else the thinker runs alone)."""
    audio_in_checkpoint = (files.config or {}).get("enable_audio_output", True)
    return audio_in_checkpoint and (deploy.output_modalities is None or "audio" in deploy.output_modalities)
