"""The Ovis-Image zoo checkpoint: registered at both sizes, in the Hub layout (a Qwen3 text
model, the MMDiT, FLUX.1's VAE), built byte-for-byte deterministically."""

from __future__ import annotations

import hashlib
import json

from omnistage.testing import build, get_model


def test_registered_with_both_sizes_and_a_call():
    model = get_model("ovis-image")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.OvisImagePipeline"
    assert model.call_kwargs["guidance_scale"] > 1 and model.call_kwargs["max_sequence_length"] <= 256


def test_folder_is_the_ovis_layout(zoo):
    index = json.loads((zoo("ovis-image") / "model_index.json").read_text())
    assert index["_class_name"] == "OvisImagePipeline"
    assert index["text_encoder"] == ["transformers", "Qwen3Model"]
    assert index["transformer"] == ["diffusers", "OvisImageTransformer2DModel"]


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    assert digests(zoo("ovis-image")) == digests(build("ovis-image", tmp_path / "b"))
