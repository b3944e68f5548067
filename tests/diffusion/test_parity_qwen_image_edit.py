"""Qwen-Image-Edit: our pipeline against diffusers' QwenImageEditPipeline on the tiny zoo model.

diffusers resizes every input image to about 1024x1024 for the VAE, so each generation
VAE-encodes a megapixel image even at the tiny size: the slowest parity module. Reference
outputs are cached per module and each test reuses the ones it can.
"""

from __future__ import annotations

import pytest

from parity import (
    BATCH_PROMPTS,
    BATCH_SEEDS,
    TOLERANCE,
    load_reference,
    max_abs_diff,
    reference_arrays,
    request_for,
    run_arrays,
    run_staggered,
)

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.pipelines import pipeline_class
from omnistage.diffusion.pipelines.base import DiffusionRequest
from omnistage.diffusion.pipelines.qwen_image_edit import QwenImageEdit, condition_size
from omnistage.testing.diffusion_models import DEFAULT_CALL_KWARGS, default_input_image

NAME = "qwen-image-edit"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def call():
    """The reference call: the zoo's defaults with the zoo's input image."""
    return dict(DEFAULT_CALL_KWARGS[NAME], image=default_input_image())


def ours_request(call_kwargs, seed, request_id="req"):
    # diffusers' edit pipeline accepts max_sequence_length and ignores it; ours rejects it.
    return request_for({k: v for k, v in call_kwargs.items() if k != "max_sequence_length"}, seed, request_id)


@pytest.fixture(scope="module")
def path(zoo):
    return zoo(NAME)


def qwen2_vl_processor(path):
    """The checkpoint's real Qwen2VLProcessor, built from its two halves.

    transformers 5.24 refuses to construct one without torchvision (its video processor
    half), which diffusers' pipeline needs to be called at all. Its `__call__` only uses
    the image processor and the tokenizer, so we set those on an instance directly."""
    from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor

    processor = Qwen2VLProcessor.__new__(Qwen2VLProcessor)
    processor.chat_template = None
    processor.image_processor = AutoImageProcessor.from_pretrained(str(path), subfolder="processor")
    processor.tokenizer = AutoTokenizer.from_pretrained(str(path), subfolder="processor")
    processor.image_token, processor.video_token = "<|image_pad|>", "<|video_pad|>"
    processor.image_token_id = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    processor.video_token_id = processor.tokenizer.convert_tokens_to_ids(processor.video_token)
    return processor


@pytest.fixture(scope="module")
def reference(path):
    from diffusers import QwenImageEditPipeline

    return load_reference(QwenImageEditPipeline, path, processor=qwen2_vl_processor(path))


@pytest.fixture(scope="module")
def expected(reference):
    """Reference outputs, computed once per (prompt, seed, steps)."""
    cache = {}

    def get(call_kwargs, seed):
        key = (call_kwargs["prompt"], seed, call_kwargs["num_inference_steps"])
        if key not in cache:
            cache[key] = reference_arrays(reference, call_kwargs, seed)
        return cache[key]

    return get


@pytest.fixture(scope="module")
def ours(path):
    return QwenImageEdit.from_pretrained(path)


def test_registered_as_native():
    assert pipeline_class("QwenImageEditPipeline") is QwenImageEdit


def test_alone_matches_diffusers(ours, expected, call):
    assert call["true_cfg_scale"] > 1 and call["negative_prompt"]  # true CFG is on
    call = dict(call, prompt=BATCH_PROMPTS[0])
    (got,) = run_arrays(ours, [ours_request(call, BATCH_SEEDS[0])])
    assert max_abs_diff(got, expected(call, BATCH_SEEDS[0])) <= TOLERANCE


def test_batch_matches_each_alone(ours, expected, call):
    # Different prompt lengths around the image tokens: padded embeddings with a mask.
    calls = [dict(call, prompt=p) for p in BATCH_PROMPTS]
    got = run_arrays(ours, [ours_request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
    for g, c, s in zip(got, calls, BATCH_SEEDS):
        assert max_abs_diff(g, expected(c, s)) <= TOLERANCE


def test_staggered_requests_share_steps(ours, expected, call):
    long_call = dict(call, prompt=BATCH_PROMPTS[0])
    short_call = dict(call, prompt=BATCH_PROMPTS[1], num_inference_steps=call["num_inference_steps"] // 2)
    got = run_staggered(ours, ours_request(long_call, BATCH_SEEDS[0], "long"),
                        ours_request(short_call, BATCH_SEEDS[1], "short"), join_after=short_call["num_inference_steps"])
    assert max_abs_diff(got[0], expected(long_call, BATCH_SEEDS[0])) <= TOLERANCE
    assert max_abs_diff(got[1], expected(short_call, BATCH_SEEDS[1])) <= TOLERANCE


def test_default_size_follows_the_input_image(ours):
    image = default_input_image().resize((96, 48))
    request = ours.prepare_request(DiffusionRequest("r", "make it blue", DiffusionParams(), images=[image]))
    width, height = condition_size(image)
    assert (request.params.width, request.params.height) == (width, height)
    assert width / height == pytest.approx(2, rel=0.05) and width * height == pytest.approx(1024 * 1024, rel=0.05)


def test_missing_image_is_rejected(ours):
    with pytest.raises(ValueError, match="image"):
        ours.encode([DiffusionRequest("r", "make it blue", DiffusionParams(height=64, width=64))])


def test_more_than_one_image_is_rejected(ours):
    images = [default_input_image(), default_input_image()]
    with pytest.raises(ValueError, match="one input image"):
        ours.encode([DiffusionRequest("r", "make it blue", DiffusionParams(height=64, width=64), images=images)])


def test_unknown_extra_is_rejected(ours):
    # Including max_sequence_length, which the edit pipeline would silently ignore.
    request = DiffusionRequest("r", "make it blue", DiffusionParams(extras={"max_sequence_length": 64}),
                               images=[default_input_image()])
    with pytest.raises(ValueError, match="max_sequence_length"):
        ours.encode([request])
