"""GLM-Image zoo builder: a random-weight `GlmImagePipeline` folder (AR prior + DiT decoder).

The folder is the diffusers layout of zai-org/GLM-Image: model_index.json names
`vision_language_encoder` (transformers `GlmImageForConditionalGeneration`, the AR model
that writes the image tokens), `processor` (`GlmImageProcessor`: its tokenizer and image
processor), `text_encoder` + `tokenizer` (T5 + ByT5, the glyph encoder for quoted text),
`transformer` (`GlmImageTransformer2DModel`), `vae` and `scheduler`.

What is smaller than the real model, and why it still runs the real code:
- the VQ codebook has 512 codes instead of 16384 (`vq_config.num_embeddings`, the DiT's
  `prior_vq_quantizer_codebook_size`); the AR vocabulary keeps the real layout: ids below
  the codebook size are image codes, the next two the image start/end tokens (the
  tokenizer's bos/eos), text tokens above the AR head's `vision_vocab_size`;
- the AR head's rows for its non-code ids are zero, so a random model draws image codes
  and almost never ends an image early (the real model learned that);
- the processor's token grid is fixed at 32 pixels per token (it is in transformers'
  code), so the VAE downsamples 8x and the DiT patch is 2, as in the real model.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    flow_match_scheduler,
    save_pipeline,
    seed_everything,
    t5_encoder,
)
from omnistage.testing.zoo import ZooModel, register_zoo_model

NUM_CODES = 512
"""VQ codebook size: image token ids are 0..NUM_CODES-1."""
VISION_VOCAB = NUM_CODES + 8
"""The AR head's width (real: 16384 codes + 128)."""

_DIMS = {
    # mrope_section splits the rotated half of the head dim (in frequency pairs) over (t, h, w).
    "tiny": dict(ar_hidden=32, ar_layers=2, ar_heads=2, mrope_section=[2, 1, 1], vision_hidden=32, dit_heads=2, dit_head_dim=16,
                 dit_layers=2, glyph_dim=32, vae=(8, 8, 16, 16)),
    "small": dict(ar_hidden=128, ar_layers=4, ar_heads=4, mrope_section=[2, 3, 3], vision_hidden=64, dit_heads=4, dit_head_dim=32,
                  dit_layers=4, glyph_dim=64, vae=(16, 32, 64, 64)),
}

# The processor's chat template (GLM style): a user turn, then the processor appends the
# target grid ("<sop>H W<eop>"...) and the image-start token that the AR model continues.
CHAT_TEMPLATE = (
    "[gMASK]{% for message in messages %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
)

# GLM-Image's scheduler_config.json (flow matching with a resolution-dependent shift).
_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.25, max_shift=0.75,
                  base_image_seq_len=256, time_shift_type="linear")

PROMPT = "a photo of a cat sitting on a red chair"
_CALL_KWARGS = dict(prompt=PROMPT, height=IMAGE_SIDE["tiny"], width=IMAGE_SIDE["tiny"],
                    num_inference_steps=4, guidance_scale=1.5)
"""Reference-pipeline kwargs for the tiny size (64x64: a 2x2 token grid, 4x4 DiT patches)."""


def _ar_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from omnistage.testing.tokenizers import build_bpe_tokenizer

    codes = [f"<|image_{i}|>" for i in range(NUM_CODES)] + ["<|begin_of_image|>", "<|end_of_image|>"]
    codes += [f"<|vision_reserved_{i}|>" for i in range(VISION_VOCAB - len(codes))]
    text_specials = ["<|endoftext|>", "<|image|>", "<sop>", "<eop>", "<|user|>", "<|assistant|>", "[gMASK]"]
    bpe = build_bpe_tokenizer(codes + text_specials, vocab_size=len(codes) + 640, chat_template=None,
                              eos_token="<|end_of_image|>", pad_token="<|endoftext|>", bos_token="<|begin_of_image|>")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe.backend_tokenizer, bos_token="<|begin_of_image|>", eos_token="<|end_of_image|>",
        pad_token="<|endoftext|>", padding_side="left",
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"},
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _vision_language_encoder(tok, dims: dict):
    import torch
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    heads = dims["ar_heads"]
    head_dim = dims["ar_hidden"] // heads
    config = GlmImageConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=dims["ar_hidden"], intermediate_size=2 * dims["ar_hidden"],
            num_hidden_layers=dims["ar_layers"], num_attention_heads=heads, num_key_value_heads=1,
            max_position_embeddings=2048, pad_token_id=tok.pad_token_id, vision_vocab_size=VISION_VOCAB,
            eos_token_id=tok.eos_token_id,
            # GLM-Image's M-RoPE: half the head dim rotates, split over (t, h, w).
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                                 mrope_section=dims["mrope_section"]),
        ),
        vision_config=dict(depth=1, hidden_size=dims["vision_hidden"], num_heads=2,
                           intermediate_size=2 * dims["vision_hidden"], patch_size=16, image_size=512),
        vq_config=dict(embed_dim=dims["vision_hidden"], num_embeddings=NUM_CODES,
                       latent_channels=dims["vision_hidden"]),
        image_token_id=tok.convert_tokens_to_ids("<|image|>"),
        image_start_token_id=tok.bos_token_id,
        image_end_token_id=tok.eos_token_id,
    )
    model = GlmImageForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.weight[NUM_CODES:] = 0  # see the module docstring
    return model


def _processor(tok):
    from transformers import GlmImageProcessor
    from transformers.models.glm_image.image_processing_pil_glm_image import GlmImageImageProcessorPil

    images = GlmImageImageProcessorPil(min_pixels=32 * 32, max_pixels=64 * 64, patch_size=16, merge_size=1,
                                       temporal_patch_size=1)
    return GlmImageProcessor(image_processor=images, tokenizer=tok, chat_template=CHAT_TEMPLATE)


def _vae(size: str, channels: tuple[int, ...]):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=list(channels), layers_per_block=1,
        latent_channels=16, norm_num_groups=8, sample_size=IMAGE_SIDE[size], use_quant_conv=False,
        use_post_quant_conv=False, mid_block_add_attention=True,
        # GLM-Image normalises latents per channel (pipeline: (z - mean) / std); seeded, not learned.
        latents_mean=[round(0.1 * ((i % 5) - 2), 3) for i in range(16)],
        latents_std=[round(0.8 + 0.05 * (i % 7), 3) for i in range(16)],
    )


def build_glm_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import GlmImagePipeline, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, GenerationConfig

    dims = _DIMS[size]
    seed_everything(seed)
    tok = _ar_tokenizer()
    vision_language_encoder = _vision_language_encoder(tok, dims)
    # The reference calls generate(do_sample=True): these are the sampling rules it applies.
    vision_language_encoder.generation_config = GenerationConfig(
        do_sample=True, temperature=0.9, top_k=64, top_p=0.95, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    glyph_tok = ByT5Tokenizer()
    transformer = GlmImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=16, num_layers=dims["dit_layers"],
        attention_head_dim=dims["dit_head_dim"], num_attention_heads=dims["dit_heads"],
        text_embed_dim=dims["glyph_dim"], time_embed_dim=2 * dims["glyph_dim"], condition_dim=16,
        prior_vq_quantizer_codebook_size=NUM_CODES,
    )
    pipe = GlmImagePipeline(
        tokenizer=glyph_tok,
        processor=_processor(tok),
        text_encoder=t5_encoder(glyph_tok, d_model=dims["glyph_dim"]),
        vision_language_encoder=vision_language_encoder,
        vae=_vae(size, dims["vae"]),
        transformer=transformer,
        scheduler=flow_match_scheduler(**_SCHEDULER),
    )
    save_pipeline(pipe, out_dir)


register_zoo_model(ZooModel(
    name="glm-image", kind="diffusion", reference_class="diffusers.GlmImagePipeline", builder=build_glm_image,
    sizes=("tiny", "small"),
    description="GLM-Image: AR vision-language model writes image tokens, a DiT draws them (two stages)",
    call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
))
