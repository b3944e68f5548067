"""The Qwen-Image-Layered zoo checkpoint: Qwen-Image's components with an RGBA VAE and the
layered transformer's options, its processor folder written from parts, registered at both sizes."""

from __future__ import annotations

import json

from omnistage.testing import get_model


def test_registered_with_both_sizes_and_a_layered_call():
    model = get_model("qwen-image-layered")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.QwenImageLayeredPipeline"
    assert model.call_kwargs["layers"] >= 2 and model.call_kwargs["prompt"]  # an empty prompt asks for a VLM caption


def test_folder_has_an_rgba_vae_and_a_layered_transformer(zoo):
    folder = zoo("qwen-image-layered")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImageLayeredPipeline" and index["processor"] == ["transformers",
                                                                                       "Qwen2VLProcessor"]
    assert json.loads((folder / "vae" / "config.json").read_text())["input_channels"] == 4
    transformer = json.loads((folder / "transformer" / "config.json").read_text())
    assert transformer["use_additional_t_cond"] and transformer["use_layer3d_rope"]
    assert (folder / "processor" / "preprocessor_config.json").is_file()
