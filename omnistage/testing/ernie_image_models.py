"""ERNIE-Image zoo builder: `ErnieImagePipeline` (a Mistral-3 text encoder read at its
penultimate layer, a single-stream DiT sharing one AdaLN modulation over image and text
tokens, the FLUX.2 VAE), without the optional prompt enhancer (`pe`, an LLM that rewrites the
prompt by sampling), which omnistage does not run.

The DiT's AdaLN modulation and final projection start at zero in diffusers (a trained
checkpoint's are learned): the builder re-draws them as any Linear layer is initialised, else
every prediction is zero and no output would depend on the prompt.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    flow_match_scheduler,
    quiet_diffusers,
    save_pipeline,
    seed_everything,
)
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, PROMPT
from omnistage.testing.flux2_models import build_mistral_tokenizer, flux2_vae, mistral3_config
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")

_ERNIE = {
    # hidden = heads * head_dim; rope_axes_dim (text position, row, col) sums to head_dim.
    "tiny": dict(text_hidden=16, hidden=32, heads=2, layers=2, axes=(4, 6, 6), vae=(8, 8, 16, 16), latent_channels=8),
    "small": dict(text_hidden=32, hidden=128, heads=4, layers=4, axes=(8, 12, 12), vae=(16, 32, 64, 64),
                  latent_channels=16),
}

# A static shift: the pipeline passes its own linear sigmas, so the shift is the one schedule
# fact it reads from the scheduler config (the real checkpoint's was not available offline).
_ERNIE_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)


def build_ernie_image(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import ErnieImagePipeline, ErnieImageTransformer2DModel
    from transformers import Mistral3Model

    dims = _ERNIE[size]
    seed_everything(seed)
    tokenizer = build_mistral_tokenizer()
    transformer = ErnieImageTransformer2DModel(
        hidden_size=dims["hidden"],
        num_attention_heads=dims["heads"],
        num_layers=dims["layers"],
        ffn_hidden_size=2 * dims["hidden"],
        in_channels=4 * dims["latent_channels"],  # the VAE latents patchified 2x2
        out_channels=4 * dims["latent_channels"],
        text_in_dim=dims["text_hidden"],
        rope_axes_dim=dims["axes"],
    )
    for zeroed in (transformer.adaLN_modulation[-1], transformer.final_linear):
        zeroed.reset_parameters()  # torch's own Linear init, from the seeded generator
    pipe = ErnieImagePipeline(
        transformer=transformer,
        vae=flux2_vae(dims),
        text_encoder=Mistral3Model(mistral3_config(tokenizer, dims["text_hidden"], num_layers=2)).eval(),
        tokenizer=tokenizer,
        scheduler=flow_match_scheduler(**_ERNIE_SCHEDULER),
    )
    with quiet_diffusers():  # it warns that the optional pe / pe_tokenizer are None
        save_pipeline(pipe, out_dir)


# No `use_pe`: a checkpoint without `pe` generates from the prompt as given whatever it says.
_CALL_KWARGS = dict(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=4.0)

register_zoo_model(ZooModel(name="ernie-image", kind="diffusion", reference_class="diffusers.ErnieImagePipeline",
                            builder=build_ernie_image, sizes=SIZES, call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="ERNIE-Image: Mistral-3 text encoder, single-stream DiT, FLUX.2 VAE"))
