"""OmniVoice (k2-fsa; the authors' package is `omnivoice`): text -> speech by iterative unmasking.

    stage 0 "unmask" (diffusion)   text (+ a designed or cloned voice) -> codes of 8 codebooks
                                   (4 in the zoo's): a bidirectional Qwen3 unmasks every target
                                   code in `num_inference_steps` steps with CFG (pipeline.py)
    stage 1 "codec"  (generation)  codes -> 24 kHz audio: Higgs-Audio v2's audio tokenizer
                                   decoder, streamed a second of frames at a time (codec.py)

One engine step of stage 0 is one unmasking step, so requests join and leave between steps.
Prompts and voices: request.py. Both stages load the checkpoint folder the authors' package
loads, with the audio tokenizer in its `audio_tokenizer/` folder.
"""

from typing import Any

from omnistage.config import PipelineSpec, StageSpec, register_pipeline
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.registry import register_diffusion_pipeline
from omnistage.generation.decoder import register_decoder
from omnistage.models.speech_support import SpeechSupport, declare_speech

__all__ = ["OMNIVOICE"]


def unmask_inputs(request: Any, inputs: dict) -> dict:
    """The user's speech request rides whole in the condition; the pipeline parses it (a 400 names the key)."""
    prompt = request.prompt.get("prompt") if isinstance(request.prompt, dict) else request.prompt
    return {"prompt": prompt if isinstance(prompt, str) else "", "condition": {"speech": request.prompt}}


def codec_inputs(request: Any, inputs: dict) -> dict:
    """The unmasked codes [frames, codebooks], and the cloned voice's loudness gain for the stream."""
    payload = inputs[0]
    return {"codes": payload.latents, "options": {"gain": payload.extras.get("gain", 1.0)}}


OMNIVOICE = PipelineSpec(
    name="omnivoice",
    stages=(
        # Step mode: a new request joins the running ones at the next unmasking step instead of
        # waiting for their whole run (each request keeps its own schedule and noise).
        StageSpec(id=0, name="unmask", kind="diffusion", output="latent", model="OmniVoice",
                  input_processor=unmask_inputs, defaults={"step_execution": True}),
        StageSpec(id=1, name="codec", kind="generation", output="audio", inputs=(0,), final_output=True,
                  model="omnivoice.codec", input_processor=codec_inputs),
    ),
    request_extras={
        "instructions": ExtraSpec(str, help="A designed voice: the authors' items, e.g. 'female, low pitch, "
                                            "british accent'."),
        "ref_audio": ExtraSpec(object, help="Voice cloning: a mono float clip (with ref_sample_rate, and its "
                                            "transcript in ref_text, which OmniVoice needs)."),
    },
)

register_diffusion_pipeline("OmniVoice", "omnistage.models.omnivoice.pipeline:OmniVoicePipeline")
register_decoder("omnivoice.codec", "omnistage.models.omnivoice.codec:OmniVoiceCodec")
# Under config.json's `architectures` name, which is also the unmasking pipeline's key (the support matrix
# reads the stage's defaults through it).
register_pipeline("OmniVoice", OMNIVOICE, deploy_config="omnivoice.yaml")
declare_speech("OmniVoice", SpeechSupport("OmniVoice", "speech",
                                          designed="`instructions`: the authors' items (gender, age, pitch, accent)",
                                          cloned="`ref_audio` + `ref_text` (required) or a registered voice"))
