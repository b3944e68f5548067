"""LTX-2 zoo builder: a random-weight `LTX2Pipeline` folder (video with audio).

LTX-2 (Lightricks) is one audio-video DiT: a Gemma 3 text encoder, text connectors that
turn its stacked hidden states into a video and an audio context, a dual-stream
transformer (video and audio tokens attend to each other), the LTX-2 video VAE, the audio
VAE (mel spectrogram latents) and a vocoder (mel -> waveform). Sizes as in
`diffusion_models.py`: `tiny` is called at 64x64 and 9 frames, `small` at 128x128.

The Gemma tokenizer is a BPE with byte fallback built here on the zoo's corpus (no
tokenizer can be downloaded), in transformers' own `GemmaTokenizer` class.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import padded_vocab_size, save_pipeline, seed_everything
from omnistage.testing.diffusion_models import (
    NEGATIVE_PROMPT,
    NUM_FRAMES,
    PROMPT,
    SIZES,
    VIDEO_SIDE,
)
from omnistage.testing.tokenizers import CORPUS, _learn_bpe_merges
from omnistage.testing.zoo import ZooModel, register_zoo_model

_LTX2 = {
    # text: the Gemma 3 hidden size (= connector heads * head dim, the caption width);
    # heads/head_dim: the video stream; audio_heads/audio_head_dim: the audio stream.
    "tiny": dict(text=32, text_layers=2, heads=2, head_dim=8, audio_heads=2, audio_head_dim=4, layers=2,
                 vae=(8,), latent=4, mel_bins=8, vocoder=32),
    "small": dict(text=64, text_layers=2, heads=4, head_dim=32, audio_heads=2, audio_head_dim=32, layers=4,
                  vae=(32, 64), latent=16, mel_bins=16, vocoder=64),
}

# Gemma's special tokens (ids 0..4 as in Gemma 3), then its image markers.
_GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
_GEMMA_IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]


def build_gemma_tokenizer(num_merges: int = 256):
    """A `GemmaTokenizer`: BPE over `▁`-joined words with byte fallback (`<0x..>` pieces), as
    Gemma's own; merges learned deterministically on the zoo corpus."""
    from transformers import GemmaTokenizer

    word_counts: dict[tuple[str, ...], int] = {}
    for line in CORPUS:
        for word in line.split():
            symbols = ("▁", *word)
            word_counts[symbols] = word_counts.get(symbols, 0) + 1
    merges = _learn_bpe_merges(word_counts, num_merges)
    chars = sorted({c for symbols in word_counts for c in symbols})
    tokens = _GEMMA_SPECIALS + _GEMMA_IMAGE_TOKENS + [f"<0x{b:02X}>" for b in range(256)] + chars
    tokens += [a + b for a, b in merges]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, extra_special_tokens=_GEMMA_IMAGE_TOKENS,
                               model_max_length=1024)
    tokenizer.padding_side = "left"
    return tokenizer


def gemma3_text_encoder(tokenizer, *, hidden_size: int, num_layers: int):
    """A tiny `Gemma3ForConditionalGeneration` (text model plus a 1-layer SigLIP tower, which the
    class always has; LTX-2 only reads the text model's hidden states)."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    ids = tokenizer.convert_tokens_to_ids(_GEMMA_IMAGE_TOKENS)
    config = Gemma3Config(
        text_config=dict(
            vocab_size=padded_vocab_size(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=hidden_size // 2,
            max_position_embeddings=2048,
            sliding_window=64,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        mm_tokens_per_image=4,
        boi_token_index=ids[0],
        eoi_token_index=ids[1],
        image_token_index=ids[2],
    )
    return Gemma3ForConditionalGeneration(config).eval()


def ltx2_video_vae(latent_channels: int, block_out_channels: tuple[int, ...]):
    """The LTX-2 video VAE: 4x4 pixel patches, then 2x per block in time and space (one block:
    8x spatial / 2x temporal; two: 16x / 4x; LTX-2's own: 32x / 8x); the VAE's compression
    ratios say which."""
    from diffusers import AutoencoderKLLTX2Video

    num_blocks = len(block_out_channels)
    return AutoencoderKLLTX2Video(
        in_channels=3,
        out_channels=3,
        latent_channels=latent_channels,
        block_out_channels=block_out_channels,
        decoder_block_out_channels=block_out_channels,
        layers_per_block=(1,) * num_blocks,
        decoder_layers_per_block=(1,) * (num_blocks + 1),
        spatio_temporal_scaling=(True,) * num_blocks,
        decoder_spatio_temporal_scaling=(True,) * num_blocks,
        decoder_inject_noise=(False,) * (num_blocks + 1),
        downsample_type=("spatial",) * num_blocks,
        upsample_residual=(False,) * num_blocks,
        upsample_factor=(1,) * num_blocks,
        timestep_conditioning=False,
        patch_size=4,  # pixels folded into channels before the blocks, as in LTX-2
        patch_size_t=1,
        encoder_causal=True,
        decoder_causal=False,
    )


def _ltx2_components(size: str) -> dict:
    import torch
    from diffusers import (
        AutoencoderKLLTX2Audio,
        FlowMatchEulerDiscreteScheduler,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    dims = _LTX2[size]
    tokenizer = build_gemma_tokenizer()
    text_encoder = gemma3_text_encoder(tokenizer, hidden_size=dims["text"], num_layers=dims["text_layers"])
    latent = dims["latent"]
    transformer = LTX2VideoTransformer3DModel(
        in_channels=latent,
        out_channels=latent,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=dims["heads"],
        attention_head_dim=dims["head_dim"],
        cross_attention_dim=dims["heads"] * dims["head_dim"],
        # Packed audio latents: 2 latent channels x mel_bins / 4 latent mel bins per token.
        audio_in_channels=2 * dims["mel_bins"] // 4,
        audio_out_channels=2 * dims["mel_bins"] // 4,
        audio_num_attention_heads=dims["audio_heads"],
        audio_attention_head_dim=dims["audio_head_dim"],
        audio_cross_attention_dim=dims["audio_heads"] * dims["audio_head_dim"],
        num_layers=dims["layers"],
        qk_norm="rms_norm_across_heads",
        caption_channels=dims["text"],
        rope_double_precision=False,
        rope_type="split",
    )
    # Connector width = the caption width the transformer projects from.
    connectors = LTX2TextConnectors(
        caption_channels=dims["text"],
        text_proj_in_factor=dims["text_layers"] + 1,  # every hidden state, embeddings included
        video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=dims["text"] // 4,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=dims["text"] // 4,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32,
        rope_theta=10000.0,
        rope_double_precision=False,
        causal_temporal_positioning=False,
        rope_type="split",
    )
    vae = ltx2_video_vae(latent, dims["vae"])
    # The audio latents' normalisation has base_channels entries, one per packed feature
    # (latent_channels * mel_bins / 4), as in LTX-2 (128 = 8 * 64 / 4).
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=2 * dims["mel_bins"] // 4,
        output_channels=2,
        ch_mult=(1,),
        num_res_blocks=1,
        attn_resolutions=None,
        in_channels=2,
        resolution=32,
        latent_channels=2,
        norm_type="pixel",
        causality_axis="height",
        dropout=0.0,
        mid_block_add_attention=False,
        sample_rate=16000,
        mel_hop_length=160,
        is_causal=True,
        mel_bins=dims["mel_bins"],
    )
    vocoder = LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins,
        hidden_channels=dims["vocoder"],
        out_channels=2,
        # 160x: one mel hop of waveform per mel frame, so the soundtrack lasts as long as the video.
        upsample_kernel_sizes=[32, 20],
        upsample_factors=[16, 10],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        leaky_relu_negative_slope=0.1,
        output_sampling_rate=16000,
    )
    # Per-channel latent statistics as the real VAEs have (not the identity the classes start
    # from), so every (de)normalisation on the way between latents and pixels is exercised.
    with torch.no_grad():
        for model, channels in ((vae, latent), (audio_vae, audio_vae.latents_mean.numel())):
            model.latents_mean.copy_(0.2 * torch.randn(channels))
            model.latents_std.copy_(0.5 + torch.rand(channels))
    # LTX-2's scheduler_config.json: flow matching with a resolution-dependent shift.
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, base_image_seq_len=1024,
        max_image_seq_len=4096, shift_terminal=0.1,
    )
    return dict(transformer=transformer, vae=vae, audio_vae=audio_vae, scheduler=scheduler,
                text_encoder=text_encoder, tokenizer=tokenizer, connectors=connectors, vocoder=vocoder)


def build_ltx2(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import LTX2Pipeline

    seed_everything(seed)
    pipe = LTX2Pipeline(**_ltx2_components(size))
    save_pipeline(pipe, out_dir)


def build_ltx2_condition(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import LTX2ConditionPipeline

    seed_everything(seed)
    save_pipeline(LTX2ConditionPipeline(**_ltx2_components(size)), out_dir)


def build_ltx2_i2v(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import LTX2ImageToVideoPipeline

    seed_everything(seed)
    save_pipeline(LTX2ImageToVideoPipeline(**_ltx2_components(size)), out_dir)


def build_ltx2_latent_upsampler(out_dir: Path, size: str, seed: int) -> None:
    """An `LTX2LatentUpsamplePipeline` folder (as the LTX-2 upsampler repos ship it): the `ltx2`
    zoo model's VAE (same seed, same build) and a 2x spatial latent upsampler."""
    from diffusers import LTX2LatentUpsamplePipeline
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel

    seed_everything(seed)
    vae = _ltx2_components(size)["vae"]
    upsampler = LTX2LatentUpsamplerModel(
        in_channels=vae.config.latent_channels,
        mid_channels=32,  # its GroupNorms take 32 groups
        num_blocks_per_stage=1,
        dims=3,
        spatial_upsample=True,
        temporal_upsample=False,
        rational_spatial_scale=2.0,
    )
    save_pipeline(LTX2LatentUpsamplePipeline(vae=vae, latent_upsampler=upsampler), out_dir)


# The reference call on `tiny`: diffusers' own guidance defaults (CFG, STG on block 1 of 2,
# modality isolation, rescale) except a shorter prompt window and 4 steps.
_CALL_KWARGS = dict(
    prompt=PROMPT,
    negative_prompt=NEGATIVE_PROMPT,
    height=VIDEO_SIDE["tiny"],
    width=VIDEO_SIDE["tiny"],
    num_frames=NUM_FRAMES,
    frame_rate=24.0,
    num_inference_steps=4,
    spatio_temporal_guidance_blocks=[1],
    max_sequence_length=32,
)

register_zoo_model(
    ZooModel(
        name="ltx2",
        kind="diffusion",
        reference_class="diffusers.LTX2Pipeline",
        builder=build_ltx2,
        sizes=SIZES,
        revision=1,  # latent statistics
        description="LTX-2 text-to-video with audio: Gemma 3 encoder + connectors, audio-video DiT, video and "
                    "audio VAEs, vocoder",
        call_kwargs=_CALL_KWARGS,
        sides=VIDEO_SIDE,
    )
)
register_zoo_model(
    ZooModel(
        name="ltx2-i2v",
        kind="diffusion",
        reference_class="diffusers.LTX2ImageToVideoPipeline",
        builder=build_ltx2_i2v,
        sizes=SIZES,
        revision=1,  # latent statistics
        description="LTX-2 image-to-video with audio: LTX-2 with the VAE-encoded image as the first latent frame",
        # Also needs image=: omnistage.testing.diffusion_models.default_input_image() gives one.
        call_kwargs=_CALL_KWARGS,
        sides=VIDEO_SIDE,
    )
)
register_zoo_model(
    ZooModel(
        name="ltx2-condition",
        kind="diffusion",
        reference_class="diffusers.LTX2ConditionPipeline",
        builder=build_ltx2_condition,
        sizes=SIZES,
        revision=1,  # latent statistics
        description="LTX-2 conditioned video with audio: LTX-2 with images at given latent frames",
        # Also needs conditions=: LTX2VideoCondition(frames=<image>, index=<latent frame>, strength=...).
        call_kwargs=_CALL_KWARGS,
        sides=VIDEO_SIDE,
    )
)
register_zoo_model(
    ZooModel(
        name="ltx2-latent-upsampler",
        kind="diffusion",
        reference_class="diffusers.LTX2LatentUpsamplePipeline",
        builder=build_ltx2_latent_upsampler,
        sizes=SIZES,
        description="LTX-2 latent upsampler: 2x spatial upsampling of the `ltx2` model's video latents, "
                    "the middle of its two-stage pipeline",
        # Called with latents= (the ltx2 model's output_type="latent" video latents) and no prompt; its
        # filters at diffusers' defaults (off).
        call_kwargs=dict(adain_factor=0.0, tone_map_compression_ratio=0.0),
    )
)
