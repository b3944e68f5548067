"""The diffusion half of the tiny zoo: each checkpoint loads with its reference diffusers
class and generates real (finite) pixels; builds are byte-for-byte deterministic."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.testing import build, get_model, list_models
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import NUM_FRAMES, default_input_image

IMAGE_MODELS = ["z-image", "qwen-image", "flux", "sd3"]
VIDEO_MODELS = ["wan-t2v", "wan-i2v", "ltx2"]
ALL_MODELS = IMAGE_MODELS + VIDEO_MODELS + ["qwen-image-edit"]
NEEDS_IMAGE = {"wan-i2v", "qwen-image-edit"}
HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def reference_class(name: str):
    import diffusers

    module, cls = get_model(name).reference_class.split(".")
    assert module == "diffusers"
    return getattr(diffusers, cls)


def load(name: str, path: Path, **kwargs):
    pipe = reference_class(name).from_pretrained(path, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def generate(pipe, name: str, **overrides):
    kwargs = dict(zoo_call_kwargs(name), **overrides)
    if name in NEEDS_IMAGE and "image" not in kwargs:
        kwargs["image"] = default_input_image()
    return pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(0), output_type="np")


def assert_real_pixels(array: np.ndarray) -> None:
    assert np.isfinite(array).all()
    assert array.std() > 0  # not a constant image


def file_digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".complete"  # the cache's own marker (zoo.ensure), not part of a build
    }


# Families whose builders (and call kwargs) live in their own modules, with their own tests.


def test_registry_lists_every_diffusion_family():
    # Families built in their own module (omnistage/testing/<family>_models.py) carry their own
    # call kwargs and are tested in their own files; this file covers diffusion_models.py.
    diffusion = [m for m in list_models() if m.kind == "diffusion"]
    names = {m.name for m in diffusion if m.builder.__module__ == "omnistage.testing.diffusion_models"}
    elsewhere = {"ltx2"}  # listed here for the generation tests; its builder is ltx2_models.py
    assert names == set(ALL_MODELS) - elsewhere
    for model in diffusion:
        assert model.sizes == ("tiny", "small")


@pytest.mark.parametrize("name", IMAGE_MODELS)
def test_tiny_image_model_generates(zoo, name):
    pipe = load(name, zoo(name))
    images = generate(pipe, name).images
    assert images.shape == (1, 64, 64, 3)
    assert_real_pixels(images)


@pytest.mark.parametrize("name", VIDEO_MODELS)
def test_tiny_video_model_generates(zoo, name):
    pipe = load(name, zoo(name))
    frames = generate(pipe, name).frames
    assert frames.shape == (1, NUM_FRAMES, 64, 64, 3)
    assert_real_pixels(frames)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_generic_diffusion_pipeline_loads_tiny(zoo, name):
    from diffusers import DiffusionPipeline

    # qwen-image-edit's Qwen2VLProcessor cannot be built without torchvision (see below).
    kwargs = {"processor": None} if name == "qwen-image-edit" and not HAS_TORCHVISION else {}
    pipe = DiffusionPipeline.from_pretrained(zoo(name), **kwargs)
    assert type(pipe) is reference_class(name)


@pytest.mark.parametrize("name", ["qwen-image", "qwen-image-edit"])
def test_qwen_template_outlives_the_dropped_prefix(zoo, name):
    # The pipelines drop the first `prompt_template_encode_start_idx` tokens of their
    # template, counted for the real Qwen tokenizer; the tiny one must still leave a prompt.
    pipe = load(name, zoo(name), **({"processor": None} if name == "qwen-image-edit" else {}))
    prefix = pipe.prompt_template_encode.split("{}")[0]
    assert len(pipe.tokenizer(prefix).input_ids) > pipe.prompt_template_encode_start_idx



def qwen_edit_prompt_embeds(pipe, processor_dir: Path, prompt: str, image):
    """What QwenImageEditPipeline._get_qwen_prompt_embeds does through Qwen2VLProcessor.

    transformers cannot construct a Qwen2VLProcessor without torchvision (its video
    processor slot needs it), so this feeds the text encoder from the processor folder's
    own parts: the PIL Qwen2-VL image processor and the tokenizer, with one
    `<|image_pad|>` per merged vision patch as the processor would expand it.
    """
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil.from_pretrained(processor_dir)
    tokenizer = AutoTokenizer.from_pretrained(processor_dir)
    vision = image_processor(images=[image], return_tensors="pt")
    num_image_tokens = int(vision["image_grid_thw"].prod()) // image_processor.merge_size**2
    text = pipe.prompt_template_encode.format(prompt).replace("<|image_pad|>", "<|image_pad|>" * num_image_tokens)
    inputs = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = pipe.text_encoder(
            **inputs,
            pixel_values=vision["pixel_values"],
            image_grid_thw=vision["image_grid_thw"],
            output_hidden_states=True,
        )
    embeds = out.hidden_states[-1][:, pipe.prompt_template_encode_start_idx :]
    return embeds, torch.ones(embeds.shape[:2], dtype=torch.long)


def test_tiny_qwen_image_edit_generates(zoo):
    path = zoo("qwen-image-edit")
    pipe = load("qwen-image-edit", path, processor=None)
    kwargs = dict(zoo_call_kwargs("qwen-image-edit"))
    prompt, negative = kwargs.pop("prompt"), kwargs.pop("negative_prompt")
    image = default_input_image()
    # The pipeline shows the text encoder the image resized to about 1024x1024.
    seen = pipe.image_processor.resize(image, 1024, 1024)
    embeds, mask = qwen_edit_prompt_embeds(pipe, path / "processor", prompt, seen)
    neg_embeds, neg_mask = qwen_edit_prompt_embeds(pipe, path / "processor", negative, seen)
    images = pipe(
        image=image,
        prompt_embeds=embeds,
        prompt_embeds_mask=mask,
        negative_prompt_embeds=neg_embeds,
        negative_prompt_embeds_mask=neg_mask,
        **kwargs,
        generator=torch.Generator("cpu").manual_seed(0),
        output_type="np",
    ).images
    assert images.shape == (1, 64, 64, 3)
    assert_real_pixels(images)


def test_qwen_image_edit_processor_folder_loads_in_parts(zoo):
    import json

    from transformers import AutoImageProcessor, AutoTokenizer

    path = zoo("qwen-image-edit")
    assert json.loads((path / "model_index.json").read_text())["processor"] == ["transformers", "Qwen2VLProcessor"]
    image_processor = AutoImageProcessor.from_pretrained(path / "processor")
    tokenizer = AutoTokenizer.from_pretrained(path / "processor")
    assert type(image_processor).__name__.startswith("Qwen2VLImageProcessor")
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") < len(tokenizer)


@pytest.mark.skipif(not HAS_TORCHVISION, reason="Qwen2VLProcessor needs torchvision in transformers 5.x")
def test_tiny_qwen_image_edit_generates_through_its_processor(zoo):
    pipe = load("qwen-image-edit", zoo("qwen-image-edit"))
    images = generate(pipe, "qwen-image-edit").images
    assert images.shape == (1, 64, 64, 3)
    assert_real_pixels(images)


def test_build_is_deterministic(zoo, tmp_path):
    first = file_digests(zoo("z-image"))  # the seed-0 build the session's cache holds (zoo.ensure ran `build`)
    again = file_digests(build("z-image", tmp_path / "b", seed=0))
    other = file_digests(build("z-image", tmp_path / "c", seed=1))
    assert first == again
    assert first.keys() == other.keys()
    weights = {k for k in first if k.endswith(".safetensors")}
    assert weights and all(first[k] != other[k] for k in weights)
    assert all(first[k] == other[k] for k in first.keys() - weights)  # configs and tokenizer


@pytest.mark.parametrize("builder", ["build_qwen2_tokenizer", "build_clip_tokenizer", "build_t5_tokenizer"])
def test_tokenizer_builders_are_deterministic(builder):
    from omnistage.testing import tokenizers

    build_tokenizer = getattr(tokenizers, builder)
    assert build_tokenizer().backend_tokenizer.to_str() == build_tokenizer().backend_tokenizer.to_str()


@pytest.mark.parametrize("name", ["z-image", "qwen-image"])
def test_small_builds_and_loads(zoo, name):
    pipe = load(name, zoo(name, size="small"))
    num_params = sum(p.numel() for p in pipe.transformer.parameters())
    assert 1_000_000 < num_params < 10_000_000
