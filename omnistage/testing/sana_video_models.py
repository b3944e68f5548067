"""SANA-Video zoo builders: `SanaVideoPipeline` (text-to-video) and `SanaImageToVideoPipeline`
(image-to-video), a Gemma 2 text model, a linear-attention 3D DiT and the Wan 2.1 VAE.

The transformer's `sample_size` picks diffusers' resolution bins (30: 480p, 22: 720p); the tiny
model has neither, so requests are generated at the size they ask for (no binning).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import padded_vocab_size, save_pipeline, seed_everything
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, PROMPT, wan_vae
from omnistage.testing.ltx2_models import build_gemma_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")
VIDEO_SIDE = {"tiny": 64, "small": 128}
# Two latent frames (the Wan VAE folds 4 frames into one after the first): the tiny test stays cheap.
NUM_FRAMES = 5

# heads * head_dim = the DiT width (rope splits head_dim over frame, height, width as Wan does).
_DIMS = {
    "tiny": dict(text_hidden=32, heads=2, head_dim=12, layers=2),
    "small": dict(text_hidden=64, heads=4, head_dim=24, layers=4),
}


def gemma2_text_encoder(tokenizer, hidden_size: int):
    """A 2-layer Gemma 2 text model (SANA's text encoder), with room for a long instruction prefix."""
    from transformers import Gemma2Config, Gemma2Model

    return Gemma2Model(Gemma2Config(
        vocab_size=padded_vocab_size(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden_size // 2,
        max_position_embeddings=4096,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )).eval()


def _components(size: str) -> dict:
    from diffusers import SanaVideoTransformer3DModel

    dims = _DIMS[size]
    inner = dims["heads"] * dims["head_dim"]
    tokenizer = build_gemma_tokenizer()
    text = dims["text_hidden"]
    # The prompt is prefixed with the pipeline's complex human instruction (hundreds of tokens).
    text_encoder = gemma2_text_encoder(tokenizer, text)
    transformer = SanaVideoTransformer3DModel(
        in_channels=16,
        out_channels=16,
        num_attention_heads=dims["heads"],
        attention_head_dim=dims["head_dim"],
        num_layers=dims["layers"],
        num_cross_attention_heads=dims["heads"],
        cross_attention_head_dim=dims["head_dim"],
        cross_attention_dim=inner,
        caption_channels=text,
        sample_size=VIDEO_SIDE[size] // 8,  # no resolution bins (see the module docstring)
        patch_size=(1, 2, 2),
    )
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=wan_vae(size))


def build_sana_video(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import DPMSolverMultistepScheduler, SanaVideoPipeline

    seed_everything(seed)
    # SANA-Video 2B 480p's scheduler_config.json: DPM-Solver++ over flow sigmas, shift 8.
    scheduler = DPMSolverMultistepScheduler(
        num_train_timesteps=1000, beta_schedule="linear", beta_start=0.0001, beta_end=0.02,
        algorithm_type="dpmsolver++", solver_order=2, prediction_type="flow_prediction",
        use_flow_sigmas=True, flow_shift=8.0,
    )
    save_pipeline(SanaVideoPipeline(**_components(size), scheduler=scheduler), out_dir)


def build_sana_video_i2v(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaImageToVideoPipeline

    seed_everything(seed)
    # The image-to-video pipeline steps with Euler over flow sigmas (shift 8 as the 480p model).
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=8.0)
    save_pipeline(SanaImageToVideoPipeline(**_components(size), scheduler=scheduler), out_dir)


# diffusers' SANA-Video pipelines name the frame count `frames`; binning off: the tiny model
# has no bins (diffusers would raise).
_T2V_CALL = dict(
    prompt=PROMPT,
    negative_prompt=NEGATIVE_PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    frames=NUM_FRAMES,
    num_inference_steps=4,
    guidance_scale=6.0,
    max_sequence_length=16,
    use_resolution_binning=False,
)

register_zoo_model(
    ZooModel(
        name="sana-video",
        kind="diffusion",
        reference_class="diffusers.SanaVideoPipeline",
        builder=build_sana_video,
        sizes=SIZES,
        description="SANA-Video text-to-video: Gemma 2 text model, linear-attention 3D DiT, Wan VAE",
        call_kwargs=_T2V_CALL,
        sides=VIDEO_SIDE,
    )
)
register_zoo_model(
    ZooModel(
        name="sana-video-i2v",
        kind="diffusion",
        reference_class="diffusers.SanaImageToVideoPipeline",
        builder=build_sana_video_i2v,
        sizes=SIZES,
        description="SANA-Video image-to-video: SANA-Video with the VAE-encoded image as the first latent frame",
        # Also needs image=: omnistage.testing.diffusion_models.default_input_image() gives one.
        call_kwargs=_T2V_CALL,
        sides=VIDEO_SIDE,
    )
)
