"""Moshi (Kyutai; PersonaPlex shares its architecture): full-duplex speech to speech.

    stage 0 "moshi" (ar)          the user's 24 kHz audio -> every 80 ms frame, Moshi's text
                                  token and 8 Mimi codes: the temporal transformer reads both
                                  audio streams and its own text, the depth decoder writes
                                  the codes (model.py)
    stage 1 "codec" (generation)  codes -> 24 kHz audio: the checkpoint's Mimi decoder,
                                  streamed (generation/mimi.py)

The model listens while it speaks: a request's input is the user's audio, and it may go on
arriving while the model runs (`AsyncOmni.update` -> `MoshiDuplex.extend_prompt`): each
step waits for the next user frame, so the user's audio paces the model. Frames go to the
codec in chunks (`models.talker_codec`'s `FrameChunks`, sized by `FrameChunkParams` as the
request's "codec" params; a duplex session sends every frame at once). Both stages load the one
checkpoint, in transformers' `MoshiForConditionalGeneration` format.

Sampling is the checkpoint's generation config (the text token; the depth decoder's codes
take the same temperature and top-k/p). Moshi never ends a reply on its own: a request
runs `max_tokens` frames, or, without it, until `max_model_len` (a duplex session: until
it closes). The session's rate and frame (24 kHz, 80 ms) are Mimi's, which the model checks
against its checkpoint.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import Duplex, PipelineSpec, StageSpec, register_pipeline
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import FrameChunkParams, FrameChunks

__all__ = ["MOSHI"]

MOSHI_STAGE, CODEC = 0, 1


def duplex_inputs(audio, final: bool) -> dict:
    return {"audio": audio, "final": final}


def duplex_params() -> dict:
    return {"codec": FrameChunkParams(first_chunk_frames=1, chunk_frames=1)}  # every 80 ms frame at once


MOSHI = PipelineSpec(
    name="moshi",
    stages=(
        StageSpec(id=MOSHI_STAGE, name="moshi", kind="ar", output="text", model="moshi.duplex", final_output=True,
                  chunk_processor=FrameChunks(CODEC)),
        StageSpec(id=CODEC, name="codec", kind="generation", output="audio", inputs=(MOSHI_STAGE,),
                  final_output=True, model="mimi", stream_input=True),
    ),
    duplex=Duplex(sample_rate=24000, frame_ms=80.0, inputs=duplex_inputs, params=duplex_params),
)

register_ar_model("moshi.duplex", "omnistage.models.moshi.model:MoshiDuplex")
register_pipeline("moshi", MOSHI, deploy_config="moshi.yaml")  # Moshi checkpoints' config.json model_type
declare_speech("moshi", SpeechSupport("Moshi", "duplex"))  # one voice: its checkpoint's
