"""VoxCPM2 (OpenBMB): tokenizer-free text -> speech, with voice design and cloning.

    stage 0 "talker" (ar)          text (+ a clip to clone) -> latent patches: a MiniCPM-4 base
                                   LM and a residual LM condition a local DiT that makes one
                                   patch per step (talker.py, modeling.py)
    stage 1 "vae"    (generation)  patches -> 48 kHz audio: the causal audio VAE's decoder,
                                   streamed with left context only (codec.py)

The recipe is `models.talker_codec`'s: the talker streams its patches to the VAE in chunks
(sized by `FrameChunkParams` as the request's "vae" params). Both stages load the checkpoint folder the
authors' `VoxCPM2Model.from_local` loads (config.json with "architecture": "voxcpm2").
Prompts, designed and cloned voices: prompt.py.
"""

from omnistage.ar.model import register_ar_model
from omnistage.config import PipelineSpec, register_pipeline
from omnistage.diffusion.params import ExtraSpec
from omnistage.generation.decoder import register_decoder
from omnistage.models.speech_support import SpeechSupport, declare_speech
from omnistage.models.talker_codec import TalkerCodec

__all__ = ["VOXCPM2"]

# A bare request speaks at most 1500 patches (60 s at 25 patches/s for the released model);
# the authors' cap of 6 patches per text token + 10 usually ends it first. The engine's
# sampling of the stop head's two logits is not used (the authors take the argmax).
TALKER_SAMPLING = {"temperature": 0.0, "max_tokens": 1500}

TALKER_CODEC = TalkerCodec(talker="voxcpm2.talker", codec="voxcpm2.vae", sampling=TALKER_SAMPLING, codec_name="vae")

VOXCPM2 = PipelineSpec(
    name="voxcpm2",
    stages=TALKER_CODEC.stages(),
    request_extras={
        "instructions": ExtraSpec(str, help="Voice design: the voice and style described in words."),
        "ref_audio": ExtraSpec(object, help="Voice cloning: a mono float clip (with ref_sample_rate; with its "
                                            "transcript in ref_text the speech continues the clip)."),
    },
)

register_ar_model("voxcpm2.talker", "omnistage.models.voxcpm2.talker:VoxCPM2Talker")
register_decoder("voxcpm2.vae", "omnistage.models.voxcpm2.codec:VoxCPM2Codec")
register_pipeline("voxcpm2", VOXCPM2, deploy_config="voxcpm2.yaml")  # config.json "architecture"
declare_speech("voxcpm2", SpeechSupport("VoxCPM2", "speech", designed="`instructions`",
                                        cloned="`ref_audio` (+ `ref_text`: continuation) or a registered voice"))
