"""The SDXL zoo checkpoint: registered at both sizes, in diffusers' SDXL layout (a UNet with
text-time conditioning, a 4-channel VAE, two CLIPs), and built byte-for-byte deterministically."""

from __future__ import annotations

import hashlib
import json

from omnistage.testing import build, get_model


def test_registered_with_both_sizes_and_a_call():
    model = get_model("sdxl")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.StableDiffusionXLPipeline"
    assert model.call_kwargs["guidance_scale"] > 1 and model.call_kwargs["negative_prompt"]


def test_folder_is_the_sdxl_layout(zoo):
    folder = zoo("sdxl")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "StableDiffusionXLPipeline" and index["force_zeros_for_empty_prompt"] is True
    assert index["unet"] == ["diffusers", "UNet2DConditionModel"]
    assert index["text_encoder_2"] == ["transformers", "CLIPTextModelWithProjection"]
    unet = json.loads((folder / "unet" / "config.json").read_text())
    assert unet["addition_embed_type"] == "text_time" and unet["in_channels"] == 4
    vae = json.loads((folder / "vae" / "config.json").read_text())
    assert (vae["latent_channels"], vae["scaling_factor"], vae["force_upcast"]) == (4, 0.13025, True)


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    assert digests(zoo("sdxl")) == digests(build("sdxl", tmp_path / "b"))
