"""Zoo builder for JoyAI-Image-Edit (`JoyImageEditPipeline`): a Qwen3-VL encoder that reads the
input image and the instruction, a double-stream 3-D DiT over the input image's and the target's
latents, the Wan 2.1 VAE.

The components are the real classes from tiny configs. As for Qwen-Image 2.1, transformers
cannot construct a `Qwen3VLProcessor` without torchvision: the pipeline is built around one
assembled from its parts, and the `processor/` folder is written in the Hub layout.

The VAE's posterior is pinned to a near-zero spread (the log-variance half of `quant_conv` is
zero with bias -30, std 3e-7): diffusers samples the input image's latents from the global RNG,
which no seed reaches, so only a posterior without spread lets a parity test compare the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from omnistage.testing.diffusion_components import (
    IMAGE_SIDE,
    flow_match_scheduler,
    quiet_diffusers,
    seed_everything,
    write_json,
)
from omnistage.testing.diffusion_models import NEGATIVE_PROMPT, wan_vae
from omnistage.testing.qwen_image21_models import qwen3_vl_config, write_qwen3_vl_processor
from omnistage.testing.tokenizers import build_qwen2_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

NAME = "joyai-image-edit"

_DIMS = {
    # head_dim = hidden / heads = sum(rope_dim_list): the RoPE splits it over (frame, height, width).
    "tiny": dict(text_hidden=32, hidden=32, heads=2, layers=1, rope=[4, 6, 6]),
    "small": dict(text_hidden=64, hidden=64, heads=2, layers=2, rope=[8, 12, 12]),
}
_VISION_PIXELS = {"tiny": 64 * 64, "small": 128 * 128}


def _pinned_posterior(vae) -> None:
    """Zero the VAE posterior's spread (see the module note)."""
    import torch

    z_dim = vae.config.z_dim
    with torch.no_grad():
        vae.quant_conv.weight[z_dim:] = 0
        vae.quant_conv.bias[z_dim:] = -30.0


def build_joyimage_edit(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import JoyImageEditPipeline, JoyImageEditTransformer3DModel

    _build(out_dir, size, seed, JoyImageEditPipeline, JoyImageEditTransformer3DModel)


def build_joyimage_edit_plus(out_dir: Path, size: str, seed: int) -> None:
    """JoyAI-Image-Edit-Plus: the same components, with the Plus transformer (patch sequences of
    several references)."""
    from diffusers import JoyImageEditPlusPipeline
    from diffusers.models.transformers.transformer_joyimage_edit_plus import JoyImageEditPlusTransformer3DModel

    _build(out_dir, size, seed, JoyImageEditPlusPipeline, JoyImageEditPlusTransformer3DModel)


def _build(out_dir: Path, size: str, seed: int, pipeline_class, transformer_class) -> None:
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    from omnistage.models.qwen_image.vl_processor import processor_from_parts

    dims = _DIMS[size]
    seed_everything(seed)
    tokenizer = build_qwen2_tokenizer()
    write_qwen3_vl_processor(out_dir / "processor", tokenizer, _VISION_PIXELS[size])
    text_encoder = Qwen3VLForConditionalGeneration(qwen3_vl_config(tokenizer, dims["text_hidden"], num_layers=2)).eval()
    transformer = transformer_class(
        patch_size=[1, 2, 2],
        in_channels=16,
        hidden_size=dims["hidden"],
        num_attention_heads=dims["heads"],
        text_dim=dims["text_hidden"],
        num_layers=dims["layers"],
        rope_dim_list=dims["rope"],
    )
    vae = wan_vae(size)
    _pinned_posterior(vae)
    pipe = pipeline_class(
        scheduler=flow_match_scheduler(num_train_timesteps=1000, shift=3.0),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
        processor=processor_from_parts(Qwen3VLProcessor, str(out_dir)),
    )
    pipe.register_modules(processor=None)  # its folder is written; the partial processor is not saved
    with quiet_diffusers():
        pipe.save_pretrained(out_dir, safe_serialization=True)
    index_path = out_dir / "model_index.json"
    index = json.loads(index_path.read_text())
    index["processor"] = ["transformers", "Qwen3VLProcessor"]
    write_json(index_path, index)


# Also needs image=: diffusion_models.default_input_image() gives one. diffusers snaps the output
# to its nearest ~1-megapixel bucket; parity tests tell it the tiny side instead.
_CALL_KWARGS = dict(prompt="make the sky purple", negative_prompt=NEGATIVE_PROMPT, height=IMAGE_SIDE["tiny"],
                    width=IMAGE_SIDE["tiny"], num_inference_steps=4, guidance_scale=4.0)

register_zoo_model(ZooModel(name=NAME, kind="diffusion", reference_class="diffusers.JoyImageEditPipeline",
                            builder=build_joyimage_edit, sizes=tuple(_DIMS), call_kwargs=_CALL_KWARGS,
                            sides=IMAGE_SIDE,
                            description="JoyAI-Image-Edit: Qwen3-VL encoder reading the input image, "
                                        "double-stream 3-D DiT over input and target latents, Wan 2.1 VAE"))

# Also needs images=[...]: the references (diffusion_models.default_input_image() gives one). diffusers
# resizes each to its ~1-megapixel bucket; parity tests shrink the buckets for both sides.

register_zoo_model(ZooModel(name=f"{NAME}-plus", kind="diffusion", reference_class="diffusers.JoyImageEditPlusPipeline",
                            builder=build_joyimage_edit_plus, sizes=tuple(_DIMS), call_kwargs=_CALL_KWARGS,
                            sides=IMAGE_SIDE,
                            description="JoyAI-Image-Edit-Plus: JoyAI-Image-Edit over several reference images, "
                                        "each at its own size, in one patch sequence"))


def plus_references() -> list:
    """Two reference images of different sizes (64x64 and 96x48) for the Plus model's calls."""
    from PIL import Image

    from omnistage.testing.diffusion_models import default_input_image

    second = default_input_image().transpose(Image.Transpose.FLIP_LEFT_RIGHT).resize((96, 48))
    return [default_input_image(), second]


@contextmanager
def small_buckets() -> Iterator[None]:
    """Within it, JoyAI-Image's output-size buckets (diffusers' `find_best_bucket`, read by
    diffusers' pipelines and ours alike) are each image's own size on the 16-pixel patch grid
    instead of ~1 megapixel, whose VAE encode alone takes the tiny Plus model many seconds a
    reference on a CPU: what tests run the Plus model in."""
    from unittest import mock

    from diffusers.pipelines.joyimage import image_processor

    with mock.patch.object(image_processor, "find_best_bucket", lambda h, w, base: (h // 16 * 16, w // 16 * 16)):
        yield
