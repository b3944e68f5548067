"""The LongCat-Image zoo checkpoint: registered at both sizes, its text_processor folder in the
Hub layout (a Qwen2VLProcessor written from its parts), built byte-for-byte deterministically."""

from __future__ import annotations

import hashlib
import json

from omnistage.testing import build, get_model


def test_registered_with_both_sizes_and_a_call():
    model = get_model("longcat-image")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.LongCatImagePipeline"
    assert model.call_kwargs["enable_prompt_rewrite"] is False and '"' in model.call_kwargs["prompt"]


def test_text_processor_folder_is_a_qwen2_vl_processor(zoo):
    folder = zoo("longcat-image")
    assert json.loads((folder / "model_index.json").read_text())["text_processor"] == ["transformers",
                                                                                       "Qwen2VLProcessor"]
    config = json.loads((folder / "text_processor" / "preprocessor_config.json").read_text())
    assert config["processor_class"] == "Qwen2VLProcessor"


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    assert digests(zoo("longcat-image")) == digests(build("longcat-image", tmp_path / "b"))
