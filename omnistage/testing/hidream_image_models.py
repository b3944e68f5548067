"""HiDream-I1 zoo builder: `HiDreamImagePipeline` (two long-context CLIP encoders for the pooled
embedding, T5 and Llama-3.1 for the sequence embeddings (every Llama layer's hidden states),
a sparse-MoE MMDiT with double- and single-stream blocks, FLUX.1's VAE).

The CLIP encoders have 248 positions (HiDream's are LongCLIP), as the pipeline pads their
prompts to min(max_sequence_length, 218) tokens. The transformer's `max_resolution` is 16x16
latent pixels (128 pixels a side): a non-square image is padded to that many tokens. The
scheduler is HiDream-I1-Dev's kind (flow matching, a static shift).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    autoencoder_kl,
    flow_match_scheduler,
    padded_vocab_size,
    save_pipeline,
    sd3_text_encoders,
    seed_everything,
)
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT
from omnistage.testing.tokenizers import build_bpe_tokenizer, build_clip_tokenizer, build_t5_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_HIDREAM = {
    "tiny": dict(clip_hidden=16, t5_hidden=16, llama_hidden=16, heads=2, head_dim=16, axes=(8, 4, 4), layers=1,
                 single_layers=1, max_resolution=16),
    "small": dict(clip_hidden=32, t5_hidden=32, llama_hidden=32, heads=4, head_dim=32, axes=(16, 8, 8), layers=2,
                  single_layers=2, max_resolution=64),
}
_LLAMA_SPECIAL_TOKENS = ("<|end_of_text|>", "<|begin_of_text|>")


def _llama_encoder(tokenizer, hidden_size: int, num_layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=padded_vocab_size(tokenizer), hidden_size=hidden_size,
                         intermediate_size=2 * hidden_size, num_hidden_layers=num_layers, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return LlamaForCausalLM(config).eval()


def build_hidream_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import HiDreamImagePipeline, HiDreamImageTransformer2DModel

    dims = _HIDREAM[size]
    seed_everything(seed)
    tokenizer, tokenizer_2 = build_clip_tokenizer(model_max_length=248), build_clip_tokenizer(model_max_length=248)
    tokenizer_3 = build_t5_tokenizer()
    tokenizer_4 = build_bpe_tokenizer(_LLAMA_SPECIAL_TOKENS, chat_template=None, eos_token="<|end_of_text|>",
                                      bos_token="<|begin_of_text|>", model_max_length=256)
    num_blocks = dims["layers"] + dims["single_layers"]
    clip = dims["clip_hidden"]
    transformer = HiDreamImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=dims["layers"],
        num_single_layers=dims["single_layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        caption_channels=[dims["t5_hidden"], dims["llama_hidden"]],
        text_emb_dim=2 * clip,
        num_routed_experts=4,
        num_activated_experts=2,
        axes_dims_rope=dims["axes"],
        max_resolution=(dims["max_resolution"], dims["max_resolution"]),
        # One Llama layer's hidden states per block, as the real checkpoint reads 48 of its 32+1.
        llama_layers=list(range(num_blocks)),
    )
    pipe = HiDreamImagePipeline(
        scheduler=flow_match_scheduler(num_train_timesteps=1000, shift=3.0),
        vae=autoencoder_kl(size, scaling_factor=0.3611, shift_factor=0.1159),
        **sd3_text_encoders((tokenizer, tokenizer_2, tokenizer_3), clip_hidden=clip, t5_hidden=dims["t5_hidden"]),
        text_encoder_4=_llama_encoder(tokenizer_4, dims["llama_hidden"], num_blocks),
        tokenizer_4=tokenizer_4,
        transformer=transformer,
    )
    save_pipeline(pipe, out_dir)


_CALL_KWARGS = dict(prompt="a photo of a cat holding a sign", negative_prompt=NEGATIVE_PROMPT,
                    height=IMAGE_SIDE["tiny"], width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=5.0,
                    max_sequence_length=32)

register_zoo_model(ZooModel(name="hidream-image", kind="diffusion", reference_class="diffusers.HiDreamImagePipeline",
                            builder=build_hidream_image, sizes=SIZES, call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="HiDream-I1: two CLIP + T5 + Llama-3.1 encoders, sparse-MoE MMDiT, FLUX.1 VAE"))
