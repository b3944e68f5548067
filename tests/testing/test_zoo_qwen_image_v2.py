"""The Qwen-Image-Edit-Plus and Qwen-Image 2.1 zoo checkpoints: real on-disk formats.

Each folder names its Qwen-VL processor class in model_index.json as the real checkpoint
does; the processor folder loads in its two halves (tokenizer, image processor) with
transformers' own Auto classes, and diffusers' pipeline loads the folder with a processor
built from them (transformers cannot build either processor without torchvision).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omnistage.testing.qwen_image21_models import NAME as V21
from omnistage.testing.qwen_image_edit_plus_models import NAME as PLUS

pytestmark = pytest.mark.slow

PROCESSORS = {PLUS: "Qwen2VLProcessor", V21: "Qwen3VLProcessor"}
PIPELINES = {PLUS: "QwenImageEditPlusPipeline", V21: "QwenImage21Pipeline"}


def reference(name: str, path):
    import diffusers
    import transformers

    from omnistage.models.qwen_image.vl_processor import processor_from_parts

    processor = processor_from_parts(getattr(transformers, PROCESSORS[name]), path)
    pipe = getattr(diffusers, PIPELINES[name]).from_pretrained(path, processor=processor)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("name", [PLUS, V21])
def test_processor_folder_loads_in_parts(zoo, name):
    from transformers import AutoImageProcessor, AutoTokenizer

    path = zoo(name)
    index = json.loads((path / "model_index.json").read_text())
    assert index["_class_name"] == PIPELINES[name] and index["processor"] == ["transformers", PROCESSORS[name]]
    tokenizer = AutoTokenizer.from_pretrained(path / "processor")
    assert type(AutoImageProcessor.from_pretrained(path / "processor")).__name__.startswith("Qwen2VLImageProcessor")
    assert tokenizer.convert_tokens_to_ids("<|image_pad|>") < len(tokenizer)


def test_tiny_v21_generates_rgba(zoo):
    pipe = reference(V21, zoo(V21))
    images = pipe("a cat", height=64, width=64, num_inference_steps=2, output_type="np",
                  generator=torch.Generator("cpu").manual_seed(0)).images
    assert images.shape == (1, 64, 64, 4)  # the 2.1 VAE writes RGBA
    assert np.isfinite(images).all() and images.std() > 0


@pytest.mark.parametrize("name", [PLUS, V21])
def test_small_builds_and_loads(zoo, name):
    pipe = reference(name, zoo(name, size="small"))
    num_params = sum(p.numel() for p in pipe.transformer.parameters())
    assert 1_000_000 < num_params < 10_000_000
