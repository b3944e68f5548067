"""FLUX.2 zoo builders: `Flux2Pipeline` (FLUX.2-dev: Mistral-3 text encoder, guidance-distilled
MMDiT) and `Flux2KleinPipeline` (FLUX.2-klein: Qwen3 text encoder, true CFG), both over the
FLUX.2 VAE (`AutoencoderKLFlux2`, latents patchified 2x2 and batch-normalised).

The text encoders keep the real depth the pipelines read from: FLUX.2-dev stacks the hidden
states of layers 10, 20 and 30 of its Mistral encoder, klein those of layers 9, 18 and 27 of
its Qwen3 one, so the tiny encoders have 30 and 27 (very narrow) layers. The transformer's
`joint_attention_dim` is three times the encoder width, as in the real checkpoints.

FLUX.2-dev's `tokenizer` is a `PixtralProcessor`, which transformers 5.24 only builds with
torchvision installed; the folder is written in its Hub layout (tokenizer files, chat
template, processor and image-processor configs) without constructing one.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    flow_match_scheduler,
    padded_vocab_size,
    quiet_diffusers,
    save_pipeline,
    seed_everything,
    write_json,
)
from omnistage.testing.tokenizers import build_bpe_tokenizer, build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_FLUX2 = {
    # heads * head_dim = the transformer width; axes_dims_rope (T, H, W, L) sums to head_dim.
    "tiny": dict(text_hidden=16, heads=2, head_dim=16, layers=1, single_layers=2, axes=(4, 4, 4, 4),
                 vae=(8, 8, 16, 16), latent_channels=8),
    "small": dict(text_hidden=32, heads=4, head_dim=32, layers=2, single_layers=4, axes=(8, 8, 8, 8),
                  vae=(16, 32, 64, 64), latent_channels=16),
}

# FLUX.2's scheduler_config.json: dynamic shifting, with the pipeline's own empirical mu.
_FLUX2_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True)

# The layers whose hidden states the pipelines stack (their `text_encoder_out_layers` defaults).
_MISTRAL_LAYERS = 30
_QWEN3_LAYERS = 27

MISTRAL_SPECIAL_TOKENS = [
    "<unk>", "<s>", "</s>", "<pad>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[IMG]", "[IMG_BREAK]", "[IMG_END]",
]

# Mistral-Small-3.1's template, trimmed to what the FLUX.2 pipeline sends: a system turn, user
# turns of text and image parts, assistant turns.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': message['content']}] %}"
    "{% else %}{% set parts = message['content'] %}{% endif %}"
    "{% if message['role'] == 'system' %}[SYSTEM_PROMPT]{% for p in parts %}{{ p['text'] }}{% endfor %}"
    "[/SYSTEM_PROMPT]"
    "{% elif message['role'] == 'user' %}[INST]{% for p in parts %}"
    "{% if p['type'] == 'text' %}{{ p['text'] }}{% else %}[IMG]{% endif %}{% endfor %}[/INST]"
    "{% else %}{% for p in parts %}{{ p['text'] }}{% endfor %}{{ eos_token }}{% endif %}{% endfor %}"
)


def flux2_vae(dims: dict):
    """The FLUX.2 VAE (also ERNIE-Image's) from `dims`' "vae" widths and "latent_channels"."""
    import torch
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(
        block_out_channels=dims["vae"],
        layers_per_block=1,
        latent_channels=dims["latent_channels"],
        norm_num_groups=8,
    )
    # Real checkpoints carry learned latent statistics; the defaults (0, 1) would hide a
    # missing normalisation.
    with torch.no_grad():
        vae.bn.running_mean.normal_(0.0, 0.1)
        vae.bn.running_var.uniform_(0.5, 1.5)
    return vae


def _flux2_transformer(dims: dict, *, guidance_embeds: bool):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4 * dims["latent_channels"],  # the VAE latents patchified 2x2
        num_layers=dims["layers"],
        num_single_layers=dims["single_layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        joint_attention_dim=3 * dims["text_hidden"],  # three stacked encoder layers
        timestep_guidance_channels=32,
        axes_dims_rope=dims["axes"],
        guidance_embeds=guidance_embeds,
    )


# --------------------------------------------------------------------------------------
# FLUX.2-dev (Flux2Pipeline): Mistral-3 encoder, guidance embedding
# --------------------------------------------------------------------------------------


def build_mistral_tokenizer():
    """A byte-level BPE with Mistral-3's special tokens and chat template (right padding)."""
    return build_bpe_tokenizer(MISTRAL_SPECIAL_TOKENS, chat_template=MISTRAL_CHAT_TEMPLATE, eos_token="</s>",
                               pad_token="<pad>", bos_token="<s>", model_max_length=1024)


def _mistral3_text_encoder(tokenizer, hidden: int):
    from transformers import Mistral3ForConditionalGeneration

    return Mistral3ForConditionalGeneration(mistral3_config(tokenizer, hidden, _MISTRAL_LAYERS)).eval()


def mistral3_config(tokenizer, hidden: int, num_layers: int):
    """A narrow Mistral-3 config (a 1-layer Pixtral vision tower) sized to `tokenizer` (also
    ERNIE-Image's text encoder)."""
    from transformers import Mistral3Config

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "</s>", "<pad>", "[IMG]")}
    return Mistral3Config(
        text_config={
            "model_type": "mistral",
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": num_layers,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": hidden // 2,
            "vocab_size": padded_vocab_size(tokenizer),
            "max_position_embeddings": 4096,
            "bos_token_id": ids["<s>"],
            "eos_token_id": ids["</s>"],
            "pad_token_id": ids["<pad>"],
        },
        vision_config={
            "model_type": "pixtral",
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "head_dim": 8,
            "image_size": 64,
            "patch_size": 16,
        },
        image_token_index=ids["[IMG]"],
        spatial_merge_size=1,
        tie_word_embeddings=False,
    )


def _write_pixtral_processor(folder: Path, tokenizer) -> None:
    """The `tokenizer` folder of a FLUX.2-dev checkpoint: a PixtralProcessor in the Hub layout."""
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(MISTRAL_CHAT_TEMPLATE)
    image_config = PixtralImageProcessorPil(size={"longest_edge": 64}, patch_size=16).to_dict()
    image_config.update(processor_class="PixtralProcessor", image_processor_type="PixtralImageProcessor")
    write_json(folder / "preprocessor_config.json", image_config)
    write_json(folder / "processor_config.json", {
        "processor_class": "PixtralProcessor", "patch_size": 16, "spatial_merge_size": 1,
        "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
    })


def build_flux2(out_dir: Path, size: str, seed: int) -> None:
    import json

    from diffusers import Flux2Pipeline

    dims = _FLUX2[size]
    seed_everything(seed)
    tokenizer = build_mistral_tokenizer()
    pipe = Flux2Pipeline(
        scheduler=flow_match_scheduler(**_FLUX2_SCHEDULER),
        vae=flux2_vae(dims),
        text_encoder=_mistral3_text_encoder(tokenizer, dims["text_hidden"]),
        tokenizer=None,
        transformer=_flux2_transformer(dims, guidance_embeds=True),  # FLUX.2-dev is guidance-distilled
    )
    with quiet_diffusers():  # it warns that the tokenizer=None it was given cannot be saved
        save_pipeline(pipe, out_dir)
    _write_pixtral_processor(out_dir / "tokenizer", tokenizer)
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["tokenizer"] = ["transformers", "PixtralProcessor"]
    write_json(index_path, index)


# --------------------------------------------------------------------------------------
# FLUX.2-klein (Flux2KleinPipeline): Qwen3 encoder, no guidance embedding, true CFG
# --------------------------------------------------------------------------------------


def _qwen3_causal_lm(tokenizer, hidden: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return Qwen3ForCausalLM(
        Qwen3Config(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=_QWEN3_LAYERS,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=hidden // 2,
            vocab_size=padded_vocab_size(tokenizer),
            max_position_embeddings=4096,
            bos_token_id=eos,
            eos_token_id=eos,
            pad_token_id=eos,
            tie_word_embeddings=True,
        )
    ).eval()


def build_flux2_klein(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import Flux2KleinPipeline

    dims = _FLUX2[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    pipe = Flux2KleinPipeline(
        scheduler=flow_match_scheduler(**_FLUX2_SCHEDULER),
        vae=flux2_vae(dims),
        text_encoder=_qwen3_causal_lm(tokenizer, dims["text_hidden"]),
        tokenizer=tokenizer,
        transformer=_flux2_transformer(dims, guidance_embeds=False),
        is_distilled=False,  # the base checkpoints: guidance_scale > 1 runs true CFG on ""
    )
    save_pipeline(pipe, out_dir)


PROMPT = "a photo of a cat sitting on a red chair"

_CALL_KWARGS: dict[str, dict] = {
    # FLUX.2-dev is guidance-distilled: guidance_scale feeds its guidance embedding.
    # FLUX.2's system message takes about 120 of the tiny tokenizer's tokens: 192 leaves room
    # for the prompt.
    "flux2": dict(prompt=PROMPT, height=IMAGE_SIDE["tiny"], width=IMAGE_SIDE["tiny"], num_inference_steps=4,
                  guidance_scale=4.0, max_sequence_length=192),
    # klein base: guidance_scale > 1 runs a second pass on the empty negative prompt.
    "flux2-klein": dict(prompt=PROMPT, height=IMAGE_SIDE["tiny"], width=IMAGE_SIDE["tiny"], num_inference_steps=4,
                        guidance_scale=4.0, max_sequence_length=64),
}


def _register(name: str, reference_class: str, builder, description: str) -> None:
    register_zoo_model(ZooModel(name=name, kind="diffusion", reference_class=reference_class, builder=builder,
                                sizes=SIZES, description=description, call_kwargs=_CALL_KWARGS[name],
                                sides=IMAGE_SIDE))


_register("flux2", "diffusers.Flux2Pipeline", build_flux2,
          "FLUX.2-dev: Mistral-3 text encoder, guidance-distilled MMDiT, FLUX.2 VAE")
_register("flux2-klein", "diffusers.Flux2KleinPipeline", build_flux2_klein,
          "FLUX.2-klein (base): Qwen3 text encoder, MMDiT with true CFG, FLUX.2 VAE")
