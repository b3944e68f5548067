"""Qwen3-ASR: speech -> text, one autoregressive stage.

    stage 0 "asr"  (ar)  audio (and a context prompt) in -> "language <Name><asr_text><transcript>"

The audio encoder and the Qwen3 decoder of `Qwen3ASRForConditionalGeneration` run on the
native AR engine (`model.Qwen3ASR`); the prompt is built by the checkpoint's own
`Qwen3ASRProcessor`. Transcriptions (`/v1/audio/transcriptions`) ask it as the processor's
`apply_transcription_request` does (`transcription.py`); chat requests with an audio part work
too. The model gives no times and does not translate: the transcription route refuses
`timestamp_granularities`, and `/v1/audio/translations` is not served.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, SpeechToText, StageSpec, register_pipeline
from omnistage.models.qwen3_asr.transcription import parse_transcript, transcription_prompt

__all__ = ["QWEN3_ASR"]

QWEN3_ASR = PipelineSpec(
    name="qwen3_asr",
    stages=(StageSpec(id=0, name="asr", kind="ar", output="text", final_output=True, model="qwen3_asr"),),
    speech_to_text=SpeechToText(prompt=transcription_prompt, parse=parse_transcript),
)

register_ar_model("qwen3_asr", "omnistage.models.qwen3_asr.model:Qwen3ASR")
register_pipeline("qwen3_asr", QWEN3_ASR, deploy_config="qwen3_asr.yaml")
register_pipeline("Qwen3ASRForConditionalGeneration", QWEN3_ASR, deploy_config="qwen3_asr.yaml")
