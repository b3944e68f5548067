"""FLUX.1-Kontext zoo builder: `FluxKontextPipeline`, an image-edit checkpoint with FLUX.1-dev's
components (the transformer reads the input image's latents next to the noise), so its tiny
folder is FLUX.1-dev's tiny components saved as a Kontext pipeline.

FluxKontextPipeline resizes every input image to one of Kontext's ~1 megapixel training
resolutions (`PREFERRED_KONTEXT_RESOLUTIONS`) before the VAE sees it, so even `tiny` encodes
a 1024x1024 input image and attends over its 4096 latent tokens.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import IMAGE_SIDE, save_pipeline, seed_everything
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, flux_components
from omnistage.testing.zoo import ZooModel, register_zoo_model

SIZES = ("tiny", "small")


def build_flux_kontext(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import FluxKontextPipeline

    seed_everything(seed)
    save_pipeline(FluxKontextPipeline(**flux_components(size)), out_dir)


# Also needs image=: diffusion_models.default_input_image() gives one. `max_area` is the output
# area diffusers rescales height x width to: the tiny side squared keeps the asked size.
# `_auto_resize=False` keeps the input image at its own size: resized to a megapixel it makes a
# tiny edit about 40x slower (the pipeline's default, True, is tested on its own).
_CALL_KWARGS = dict(prompt="make the cat wear a red hat", negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], max_area=IMAGE_SIDE["tiny"] ** 2, _auto_resize=False,
                    num_inference_steps=4, guidance_scale=2.5, true_cfg_scale=1.0, max_sequence_length=64)

register_zoo_model(ZooModel(name="flux-kontext", kind="diffusion", reference_class="diffusers.FluxKontextPipeline",
                            builder=build_flux_kontext, sizes=SIZES, call_kwargs=_CALL_KWARGS, sides=IMAGE_SIDE,
                            description="FLUX.1-Kontext-dev: FLUX.1 editing an input image read as extra latent tokens"))
