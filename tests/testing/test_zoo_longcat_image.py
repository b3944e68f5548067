"""The LongCat-Image zoo checkpoints (text-to-image and edit): registered at both sizes, its text_processor folder in the
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


def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}


def test_build_is_deterministic(zoo, tmp_path):
    assert digests(zoo("longcat-image")) == digests(build("longcat-image", tmp_path / "b"))


def test_edit_folder_is_longcat_image_saved_as_an_edit_pipeline(zoo):
    # The same components (and text_processor folder); only the pipeline class differs.
    model = get_model("longcat-image-edit")
    assert model.reference_class == "diffusers.LongCatImageEditPipeline" and "height" not in model.call_kwargs
    edit, t2i = zoo("longcat-image-edit"), zoo("longcat-image")
    assert json.loads((edit / "model_index.json").read_text())["_class_name"] == "LongCatImageEditPipeline"
    assert {k: v for k, v in digests(edit).items() if k != "model_index.json"} == \
           {k: v for k, v in digests(t2i).items() if k != "model_index.json"}
