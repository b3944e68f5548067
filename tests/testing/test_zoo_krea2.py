"""The Krea 2 zoo checkpoint: registered at both sizes, its text-encoder taps a pipeline config
fact the DiT's text fusion matches, built byte-for-byte deterministically."""

from __future__ import annotations

import hashlib
import json

from omnistage.testing import build, get_model


def test_registered_with_both_sizes_and_a_call():
    model = get_model("krea2")
    assert model.sizes == ("tiny", "small") and model.reference_class == "diffusers.Krea2Pipeline"
    assert model.call_kwargs["guidance_scale"] > 0 and model.call_kwargs["negative_prompt"]


def test_taps_match_the_text_fusion(zoo):
    folder = zoo("krea2")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "Krea2Pipeline" and index["text_encoder"] == ["transformers", "Qwen3VLModel"]
    transformer = json.loads((folder / "transformer" / "config.json").read_text())
    text = json.loads((folder / "text_encoder" / "config.json").read_text())["text_config"]
    assert transformer["num_text_layers"] == len(index["text_encoder_select_layers"])
    assert max(index["text_encoder_select_layers"]) <= text["num_hidden_layers"]


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    assert digests(zoo("krea2")) == digests(build("krea2", tmp_path / "b"))
