"""The ERNIE-Image zoo checkpoint: registered at both sizes, without the prompt enhancer, its
DiT's zero-initialised output layers re-drawn (so outputs depend on the prompt), built
byte-for-byte deterministically."""

from __future__ import annotations

import hashlib
import json

import torch

from omnistage.testing import build, get_model


def test_registered_with_both_sizes_and_a_call():
    model = get_model("ernie-image")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.ErnieImagePipeline"
    assert "use_pe" not in model.call_kwargs and model.call_kwargs["guidance_scale"] > 1


def test_folder_has_no_prompt_enhancer_and_live_output_layers(zoo):
    from diffusers import ErnieImageTransformer2DModel

    index = json.loads((zoo("ernie-image") / "model_index.json").read_text())
    assert index["_class_name"] == "ErnieImagePipeline" and index["pe"] == [None, None]
    transformer = ErnieImageTransformer2DModel.from_pretrained(zoo("ernie-image"), subfolder="transformer")
    assert torch.count_nonzero(transformer.final_linear.weight) and torch.count_nonzero(
        transformer.adaLN_modulation[-1].weight)


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    assert digests(zoo("ernie-image")) == digests(build("ernie-image", tmp_path / "b"))
