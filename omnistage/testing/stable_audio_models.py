"""Stable Audio zoo builder: a random-weight `StableAudioPipeline` folder (diffusers format).

The real Stable Audio Open 1.0: a T5-base text encoder, a projection model that embeds the
prompt and the start/end seconds, a 24-layer `StableAudioDiTModel` over 1024 latent frames,
and the Oobleck VAE (2048x downsampling, stereo, 44.1 kHz). Here the same classes, tiny:

- `tiny`: 8 kHz stereo, 64x downsampling, 128 latent frames = 1.024 s of audio at most.
- `small`: 16 kHz stereo, 256x downsampling, 256 latent frames = 4.096 s, for benchmarks.

The scheduler is the class the pipeline declares, `EDMDPMSolverMultistepScheduler`, in its
stochastic `sde-dpmsolver++` form with the real checkpoint's sigmas (0.3 to 500, exponential,
v-prediction), so each step draws noise from the request's generator as the real
`CosineDPMSolverMultistepScheduler` does (that one needs the optional `torchsde`).
It registers the kwargs for calling the reference pipeline on `tiny` (`omnistage.testing.call_kwargs`).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import save_pipeline, seed_everything, t5_encoder
from omnistage.testing.tokenizers import build_t5_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

_DIMS = {
    "tiny": dict(text_hidden=32, conditioning=24, heads=4, kv_heads=2, head_dim=8, layers=2, cross=32,
                 latent=8, sample_size=128, downsampling=[2, 4, 8], multiples=[1, 2, 2], vae_hidden=16,
                 vae_decoder=8, sampling_rate=8000, max_tokens=32),
    "small": dict(text_hidden=64, conditioning=64, heads=8, kv_heads=4, head_dim=16, layers=4, cross=128,
                  latent=16, sample_size=256, downsampling=[2, 4, 4, 8], multiples=[1, 2, 2, 4], vae_hidden=32,
                  vae_decoder=16, sampling_rate=16000, max_tokens=64),
}


def build_stable_audio(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import AutoencoderOobleck, EDMDPMSolverMultistepScheduler, StableAudioDiTModel, StableAudioPipeline
    from diffusers.pipelines.stable_audio.modeling_stable_audio import StableAudioProjectionModel

    dims = _DIMS[size]
    seed_everything(seed)
    # Stable Audio pads every prompt to the tokenizer's model_max_length (128 in the real one).
    tokenizer = build_t5_tokenizer(model_max_length=dims["max_tokens"])
    text_encoder = t5_encoder(tokenizer, d_model=dims["text_hidden"])
    projection_model = StableAudioProjectionModel(
        text_encoder_dim=dims["text_hidden"],
        conditioning_dim=dims["conditioning"],
        min_value=0,  # seconds, as in the real checkpoint
        max_value=512,
    )
    transformer = StableAudioDiTModel(
        sample_size=dims["sample_size"],
        in_channels=dims["latent"],
        num_layers=dims["layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        num_key_value_attention_heads=dims["kv_heads"],
        out_channels=dims["latent"],
        cross_attention_dim=dims["cross"],
        time_proj_dim=16,
        # The global state is [seconds_start, seconds_end] side by side.
        global_states_input_dim=2 * dims["conditioning"],
        cross_attention_input_dim=dims["conditioning"],
    )
    # The encoder's output is mean and scale of the latent: twice the decoder's input channels.
    vae = AutoencoderOobleck(
        encoder_hidden_size=dims["vae_hidden"],
        downsampling_ratios=dims["downsampling"],
        channel_multiples=dims["multiples"],
        decoder_channels=dims["vae_decoder"],
        decoder_input_channels=dims["latent"],
        audio_channels=2,
        sampling_rate=dims["sampling_rate"],
    )
    scheduler = EDMDPMSolverMultistepScheduler(
        sigma_min=0.3,
        sigma_max=500.0,
        sigma_data=1.0,
        sigma_schedule="exponential",
        solver_order=2,
        prediction_type="v_prediction",
        algorithm_type="sde-dpmsolver++",
        final_sigmas_type="zero",
    )
    pipe = StableAudioPipeline(vae=vae, text_encoder=text_encoder, projection_model=projection_model,
                               tokenizer=tokenizer, transformer=transformer, scheduler=scheduler)
    save_pipeline(pipe, out_dir)


_CALL_KWARGS = dict(
    prompt="the sound of a hammer hitting a wooden surface",
    negative_prompt="low quality",
    audio_end_in_s=0.5,
    num_inference_steps=4,
    guidance_scale=7.0,
)

register_zoo_model(
    ZooModel(
        name="stable-audio",
        kind="diffusion",
        reference_class="diffusers.StableAudioPipeline",
        builder=build_stable_audio,
        sizes=("tiny", "small"),
        description="Stable Audio: T5 + seconds conditioning, 1D DiT, stereo Oobleck VAE (text -> audio)",
        call_kwargs=_CALL_KWARGS,
    )
)
