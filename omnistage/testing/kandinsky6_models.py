"""Kandinsky 6 zoo builder: a random-weight `Kandinsky6TI2VAPipeline` folder (text or image to
video with its soundtrack).

Kandinsky 6 TI2VA is one multimodal DiT that denoises video and audio latents together,
conditioned on Qwen2.5-VL token states and a CLIP pooled embedding; the HunyuanVideo VAE
decodes the video, the MMAudio VAE decodes the audio latents to a mel spectrogram and a
BigVGAN vocoder turns it into a mono waveform. `tiny` is called at 64x64 and 9 frames.

- The `tokenizer` component is a Qwen2_5_VLProcessor, which transformers 5.24 cannot build
  without torchvision (see diffusion_models.py, Qwen-Image-Edit): the pipeline is saved
  without it, the folder is written from its parts and model_index.json names the class.
- diffusers zero-initialises the transformer's output and modulation layers (training starts
  from identity blocks): zero weights are given seeded values here, as a trained checkpoint
  has, so the blocks and both outputs depend on every input.
- The audio runs at 8 kHz (an AAC rate) with a 128-sample latent hop: about 60 audio latent
  frames a second, so a tiny clip has a few dozen audio tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.diffusion_components import (
    clip_text_encoder,
    fill_placeholders,
    qwen2_5_vl_text_encoder,
    quiet_diffusers,
    save_pipeline,
    seed_everything,
    write_json,
)
from omnistage.testing.diffusion_models import (
    NEGATIVE_PROMPT,
    NUM_FRAMES,
    PROMPT,
    SIZES,
    VIDEO_SIDE,
    write_qwen2_vl_processor,
)
from omnistage.testing.tokenizers import build_clip_tokenizer, build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

_DIMS = {
    "tiny": dict(qwen=32, clip=16, model=16, ff=32, time=16, blocks=2, axes=(4, 2, 2), vae=(8, 8, 8)),
    "small": dict(qwen=64, clip=32, model=32, ff=64, time=32, blocks=4, axes=(8, 4, 4), vae=(16, 32, 32)),
}
LATENT_CHANNELS = 4
AUDIO_LATENT_CHANNELS = 4


def _components(size: str) -> dict:
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        Kandinsky6Transformer3DModel,
        MMAudioVAE,
        MMAudioVocoder,
    )

    dims = _DIMS[size]
    tokenizer = build_qwen2_tokenizer()
    text_encoder = qwen2_5_vl_text_encoder(tokenizer, hidden_size=dims["qwen"], num_layers=2, vision_depth=1)
    tokenizer_2 = build_clip_tokenizer()
    text_encoder_2 = clip_text_encoder(tokenizer_2, hidden_size=dims["clip"])
    # The released checkpoints' architecture flags (text padding, cross-modal RoPE and gates,
    # fixed modulation) and token types for the appended reference frame.
    transformer = Kandinsky6Transformer3DModel(
        in_visual_dim=LATENT_CHANNELS, out_visual_dim=LATENT_CHANNELS, in_text_dim=dims["qwen"],
        in_text_dim2=dims["clip"], time_dim=dims["time"], patch_size=(1, 2, 2), model_dim=dims["model"],
        ff_dim=dims["ff"], num_text_blocks=1, num_visual_blocks=dims["blocks"], axes_dims=dims["axes"],
        visual_cond=True, in_audio_dim=AUDIO_LATENT_CHANNELS, out_audio_dim=AUDIO_LATENT_CHANNELS,
        text_token_padding=True, ca_rope=True, cross_gates=True, fix_modulation=True,
        visual_token_type_num_embeddings=2,
    )
    fill_placeholders(*[p for p in transformer.parameters() if not p.detach().abs().max() > 0])
    levels = len(dims["vae"])
    vae = AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, block_out_channels=list(dims["vae"]),
        down_block_types=["HunyuanVideoDownBlock3D"] * levels, up_block_types=["HunyuanVideoUpBlock3D"] * levels,
        layers_per_block=1, mid_block_add_attention=False, norm_num_groups=2, act_fn="silu",
        scaling_factor=0.476986, spatial_compression_ratio=8, temporal_compression_ratio=4,
    )
    audio_vae = MMAudioVAE(mel_bins=8, latent_channels=AUDIO_LATENT_CHANNELS, hidden_channels=8,
                           channel_multipliers=(1, 2), layers_per_block=1, sample_rate=8000, n_fft=256, hop_length=64)
    # The vocoder's upsampling (4 * 4 * 4) is the audio VAE's mel hop.
    vocoder = MMAudioVocoder(num_mels=8, upsample_initial_channel=16, upsample_rates=(4, 4, 4),
                             upsample_kernel_sizes=(8, 8, 8), resblock_kernel_sizes=(3,),
                             resblock_dilation_sizes=((1, 3),))
    # Kandinsky 6 Pro's scheduler: flow matching with a fixed shift.
    scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    return dict(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, scheduler=scheduler, audio_vae=audio_vae,
                vocoder=vocoder)


def build_kandinsky6(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import Kandinsky6TI2VAPipeline

    seed_everything(seed)
    components = _components(size)
    tokenizer = components.pop("tokenizer")
    with quiet_diffusers():  # it warns that the tokenizer=None it was given cannot be saved
        save_pipeline(Kandinsky6TI2VAPipeline(**components, tokenizer=None), out_dir)
    write_qwen2_vl_processor(out_dir / "tokenizer", tokenizer, 56 * 56, processor_class="Qwen2_5_VLProcessor")
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["tokenizer"] = ["transformers", "Qwen2_5_VLProcessor"]
    write_json(index_path, index)


# The reference call on `tiny`: CFG on (diffusers' default scale), a prompt window that reaches
# past the zoo tokenizer's longer chat template (diffusers crops a fixed 129 template tokens).
_CALL_KWARGS = dict(
    prompt=PROMPT,
    negative_prompt=NEGATIVE_PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    num_frames=NUM_FRAMES,
    frame_rate=24.0,
    num_inference_steps=4,
    guidance_scale=5.0,
    max_sequence_length=320,
)

register_zoo_model(
    ZooModel(
        name="kandinsky6",
        kind="diffusion",
        reference_class="diffusers.Kandinsky6TI2VAPipeline",
        builder=build_kandinsky6,
        sizes=SIZES,
        description="Kandinsky 6 TI2VA: text/image to video with audio; Qwen2.5-VL + CLIP encoders, audio-video DiT, "
                    "HunyuanVideo VAE, MMAudio VAE and vocoder",
        call_kwargs=_CALL_KWARGS,
        sides=VIDEO_SIDE,
    )
)
