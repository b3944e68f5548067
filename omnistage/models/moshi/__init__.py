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
codec in chunks (Qwen3-Omni's `frame_chunks`, sized by `Code2WavParams` as the request's
"codec" params; a duplex session sends every frame at once). Both stages load the one
checkpoint, in transformers' `MoshiForConditionalGeneration` format.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.models.qwen3_omni.processors import frame_chunks

__all__ = ["MOSHI", "MOSHI_SAMPLING"]

MOSHI_STAGE, CODEC = 0, 1

# The checkpoint's generation config (kyutai's text sampling). Moshi never ends a reply on
# its own: a bare request runs at most 250 frames (20 s); a duplex session runs until it closes.
MOSHI_SAMPLING = {"max_tokens": 250}


def moshi_chunks(request, payload, finished: bool) -> dict | None:
    return frame_chunks(request, payload, finished, CODEC)


MOSHI = PipelineSpec(
    name="moshi",
    stages=(
        StageSpec(id=MOSHI_STAGE, name="moshi", kind="ar", output="text", model="moshi.duplex",
                  chunk_processor=moshi_chunks, defaults={"default_sampling_params": MOSHI_SAMPLING}),
        StageSpec(id=CODEC, name="codec", kind="generation", output="audio", inputs=(MOSHI_STAGE,),
                  final_output=True, model="mimi", stream_input=True),
    ),
)

register_ar_model("moshi.duplex", "omnistage.models.moshi.model:MoshiDuplex")
register_pipeline("moshi", MOSHI, deploy_config="moshi.yaml")  # Moshi checkpoints' config.json model_type
