"""The HiDream-I1 zoo checkpoint: four text encoders (two long-context CLIP, T5, Llama) in their
real classes, a MoE transformer reading one Llama layer per block, registered at both sizes."""

from __future__ import annotations

import json

from omnistage.testing import get_model


def test_registered_with_both_sizes_and_a_cfg_call():
    model = get_model("hidream-image")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.HiDreamImagePipeline"
    assert model.call_kwargs["guidance_scale"] > 1 and model.call_kwargs["negative_prompt"]


def test_folder_has_the_four_encoders_and_a_moe_transformer(zoo):
    folder = zoo("hidream-image")
    index = json.loads((folder / "model_index.json").read_text())
    assert [index[f"text_encoder{s}"][1] for s in ("", "_2", "_3", "_4")] == [
        "CLIPTextModelWithProjection", "CLIPTextModelWithProjection", "T5EncoderModel", "LlamaForCausalLM"]
    clip = json.loads((folder / "text_encoder" / "config.json").read_text())
    assert clip["max_position_embeddings"] >= 218  # the pipeline pads CLIP prompts up to 218 tokens
    transformer = json.loads((folder / "transformer" / "config.json").read_text())
    llama = json.loads((folder / "text_encoder_4" / "config.json").read_text())
    assert transformer["num_routed_experts"] > transformer["num_activated_experts"] > 0
    assert max(transformer["llama_layers"]) < llama["num_hidden_layers"]
