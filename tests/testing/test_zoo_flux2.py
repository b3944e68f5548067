"""The FLUX.2 zoo checkpoints: both load with their diffusers classes and generate real
pixels at both sizes, the dev tokenizer folder is a PixtralProcessor in the Hub layout, and
builds are byte-for-byte deterministic."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch

from omnistage.testing import build, get_model, list_models
from omnistage.testing import call_kwargs as zoo_call_kwargs

MODELS = {"flux2": "Flux2Pipeline", "flux2-klein": "Flux2KleinPipeline"}


def load(name: str, path):
    """The reference pipeline; FLUX.2-dev's PixtralProcessor needs torchvision, so its
    tokenizer (what the text path uses) stands in for it."""
    import diffusers
    from transformers import AutoTokenizer

    cls = getattr(diffusers, MODELS[name])
    if name != "flux2":
        pipe = cls.from_pretrained(str(path))
    else:
        loaded = cls.from_pretrained(str(path), tokenizer=None)
        pipe = cls(**dict(loaded.components, tokenizer=AutoTokenizer.from_pretrained(str(path), subfolder="tokenizer")))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_both_are_registered_with_both_sizes():
    names = {m.name for m in list_models() if m.builder.__module__ == "omnistage.testing.flux2_models"}
    assert names == set(MODELS) == {name for name in names if get_model(name).call_kwargs}
    for name in names:
        assert get_model(name).sizes == ("tiny", "small")
        assert get_model(name).reference_class == f"diffusers.{MODELS[name]}"


@pytest.mark.parametrize("size", ["tiny", "small"])
@pytest.mark.parametrize("name", list(MODELS))
def test_generates_real_pixels(zoo, name, size):
    pipe = load(name, zoo(name, size=size))
    side = 64 if size == "tiny" else 128  # small's default is 256; 128 keeps the test short
    out = pipe(**dict(zoo_call_kwargs(name), height=side, width=side, num_inference_steps=2),
               generator=torch.Generator("cpu").manual_seed(0), output_type="np").images
    assert out.shape == (1, side, side, 3) and np.isfinite(out).all() and out.std() > 0
    num_params = sum(p.numel() for p in pipe.transformer.parameters())
    assert (num_params < 1_000_000) == (size == "tiny")


def test_dev_tokenizer_folder_is_a_pixtral_processor(zoo):
    folder = zoo("flux2") / "tokenizer"
    assert json.loads((zoo("flux2") / "model_index.json").read_text())["tokenizer"] == ["transformers",
                                                                                        "PixtralProcessor"]
    assert json.loads((folder / "processor_config.json").read_text())["processor_class"] == "PixtralProcessor"
    assert json.loads((folder / "preprocessor_config.json").read_text())["image_processor_type"] == \
        "PixtralImageProcessor"
    assert (folder / "chat_template.jinja").read_text().startswith("{{ bos_token }}")


def test_build_is_deterministic(zoo, tmp_path):
    def digests(folder):  # `.complete` is the cache's own marker (zoo.ensure), not part of a build
        return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".complete"}

    # The seed-0 build the session's cache holds (zoo.ensure ran `build`) against a fresh one.
    assert digests(zoo("flux2")) == digests(build("flux2", tmp_path / "b"))
