"""Krea 2 zoo builder: `Krea2Pipeline` (a Qwen3-VL text model whose hidden states at several
layers are stacked per token, a DiT that fuses them, Qwen-Image's causal-3D VAE).

The real pipeline taps twelve layers of a 36-layer encoder; the tap list is a pipeline config
fact (`text_encoder_select_layers` in model_index.json), so the tiny folder taps both layers
of a 2-layer encoder and the transformer fuses two text layers.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import IMAGE_SIDE, flow_match_scheduler, save_pipeline, seed_everything
from omnistage.testing.diffusion_models import _QWEN_IMAGE_VAE, NEGATIVE_PROMPT, PROMPT, qwen_image_vae
from omnistage.testing.qwen_image21_models import qwen3_vl_config
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_KREA2 = {
    # heads * head_dim = the DiT width; axes_dims_rope sums to head_dim.
    "tiny": dict(text_hidden=16, heads=2, kv_heads=1, head_dim=16, layers=2, axes=(4, 6, 6)),
    "small": dict(text_hidden=32, heads=4, kv_heads=2, head_dim=32, layers=4, axes=(8, 12, 12)),
}
_SELECT_LAYERS = (1, 2)  # hidden_states[0] is the embedding output

# Resolution-dependent shift (the base checkpoint; the distilled one fixes mu), read by the pipeline.
_KREA2_SCHEDULER = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5,
                        max_shift=1.15, base_image_seq_len=256, max_image_seq_len=6400)


def build_krea2(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import Krea2Pipeline, Krea2Transformer2DModel
    from transformers import Qwen3VLModel

    dims = _KREA2[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    text = dims["text_hidden"]
    transformer = Krea2Transformer2DModel(
        in_channels=64,  # 16 latent channels packed 2x2
        num_layers=dims["layers"],
        attention_head_dim=dims["head_dim"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"],
        intermediate_size=2 * dims["heads"] * dims["head_dim"],
        timestep_embed_dim=32,
        text_hidden_dim=text,
        num_text_layers=len(_SELECT_LAYERS),
        text_num_attention_heads=2,
        text_num_key_value_heads=2,
        text_intermediate_size=2 * text,
        num_layerwise_text_blocks=1,
        num_refiner_text_blocks=1,
        axes_dims_rope=dims["axes"],
    )
    pipe = Krea2Pipeline(
        scheduler=flow_match_scheduler(**_KREA2_SCHEDULER),
        vae=qwen_image_vae(_QWEN_IMAGE_VAE[size]),
        text_encoder=Qwen3VLModel(qwen3_vl_config(tokenizer, text, num_layers=2)).eval(),
        tokenizer=tokenizer,
        transformer=transformer,
        text_encoder_select_layers=_SELECT_LAYERS,
    )
    save_pipeline(pipe, out_dir)


_CALL_KWARGS = dict(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=4.5, max_sequence_length=64)

register_zoo_model(ZooModel(name="krea2", kind="diffusion", reference_class="diffusers.Krea2Pipeline",
                            builder=build_krea2, sizes=SIZES, call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="Krea 2: Qwen3-VL layer-stacked text features, DiT, Qwen-Image VAE"))
