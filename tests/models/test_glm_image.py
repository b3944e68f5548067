"""GLM-Image end to end on the tiny zoo checkpoint: the AR prior on our AR engine and the DiT
stage, through the orchestrator, against diffusers' `GlmImagePipeline` for the same seed.

How the two are made comparable: the reference seeds torch's global generator with the
image seed and calls `generate(do_sample=True)` with the checkpoint's generation_config
(temperature, top-k, top-p); `torch.multinomial` then draws each token as argmax(p / q)
with q ~ Exp(1) from that generator. Our prior gets the same seed (the image's), the same
rules (the stage's default sampling params, read from generation_config.json) and draws
with the same exponential race from its own generator seeded with it, so a request's
tokens are the reference's, alone or batched (each request has its own generator, where
the reference's batched draws would share one).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from omnistage.core.errors import ErrorKind
from omnistage import Omni
from omnistage.ar import SamplingParams
from omnistage.ar.engine import AREngine
from omnistage.config import resolve
from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.core.types import StageRequest
from omnistage.diffusion.params import DiffusionParams
from omnistage.models.glm_image import prior_sampling
from omnistage.models.glm_image.grid import prior_grid
from omnistage.models.glm_image.prior import decode_positions
from omnistage.testing import call_kwargs as zoo_call_kwargs

GLM_CALL = zoo_call_kwargs("glm-image")

PROMPTS = ["a cat", "a photo of a small dog on a long red chair", 'a sign that says "hi"']
SIDE = GLM_CALL["height"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    pass


@pytest.fixture(scope="module")
def path(zoo):
    return str(zoo("glm-image"))


@pytest.fixture(scope="module")
def reference(path):
    from diffusers import GlmImagePipeline

    pipe = GlmImagePipeline.from_pretrained(path, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@functools.cache  # the staggered and prepacked tests both check prompt 0 with seed 3: one reference run
def reference_tokens(reference, prompt: str, seed: int, height: int = SIDE, width: int = SIDE) -> list[int]:
    """What GlmImagePipeline.generate_prior_tokens' `generate` call writes for one prompt."""
    messages = [[{"role": "user", "content": [{"type": "text", "text": prompt}]}]]
    inputs = reference.processor.apply_chat_template(messages, tokenize=True, target_h=height, target_w=width,
                                                     return_dict=True, return_tensors="pt")
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = reference.vision_language_encoder.generate(
            **inputs, max_new_tokens=prior_grid(height, width).num_new_tokens, do_sample=True)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def reference_image(reference, prompt: str, seed: int, **kwargs) -> np.ndarray:
    call = dict(GLM_CALL, prompt=prompt, **kwargs)
    return reference(**call, generator=torch.Generator().manual_seed(seed), output_type="np").images[0]


def test_decode_positions_are_the_models_own(path, reference):
    # Our position table for the written tokens equals the one transformers builds for generate.
    enc = reference.processor.apply_chat_template([[{"role": "user", "content": [{"type": "text", "text": "a"}]}]],
                                                  tokenize=True, target_h=64, target_w=96, return_dict=True,
                                                  return_tensors="pt")
    model = reference.vision_language_encoder.model
    model.get_rope_index(enc["input_ids"], enc["image_grid_thw"], enc["images_per_sample"], enc["attention_mask"])
    theirs = model._cached_decode_position_ids[0]
    ours = decode_positions(enc["input_ids"].shape[1], prior_grid(64, 96))
    assert torch.equal(ours, theirs)


def test_prior_sampling_rules_come_from_generation_config(path, reference):
    from omnistage.config.model_files import ModelFiles

    config = reference.vision_language_encoder.generation_config
    assert prior_sampling(ModelFiles(path)) == {"temperature": config.temperature, "top_k": config.top_k,
                                                "top_p": config.top_p, "max_tokens": None}


def test_prior_tokens_match_generate_alone_and_staggered(path, reference):
    # Three seeded requests on one AR engine, the third joining while the others decode:
    # each writes exactly the reference's tokens for its prompt and seed.
    spec = resolve(path)
    rules = dict(spec.stages[0].defaults["default_sampling_params"])
    engine = AREngine(path, spec.stages[0], StageDeployConfig(max_num_seqs=4))
    seeds = [3, 4, 5]
    tokens = {}

    def add(i):
        engine.add_request(StageRequest(str(i), {"prompt": PROMPTS[i], "height": SIDE, "width": SIDE},
                                        SamplingParams(seed=seeds[i], **rules)))

    add(0), add(1)
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[int(out.request_id)] = out.payload.token_ids
        steps += 1
        if steps == 20:
            add(2)
    engine.close()
    for i in range(3):
        want = reference_tokens(reference, PROMPTS[i], seeds[i])
        assert len(want) == prior_grid(SIDE, SIDE).num_new_tokens
        assert tokens[i][:-1] == want[:-1]  # the last one is the image end, where the reference samples on
    assert tokens[0] != tokens[1]


@pytest.fixture(scope="module")
def omni(path):
    with Omni(path, stage_overrides={"0": {"max_num_seqs": 4}, "1": {"max_num_seqs": 4}}) as omni:
        yield omni


def _params(seed: int, **kwargs) -> DiffusionParams:
    call = {k: GLM_CALL[k] for k in ("height", "width", "num_inference_steps", "guidance_scale")}
    return DiffusionParams(seed=seed, **{**call, **kwargs})


def _close(got, want: np.ndarray) -> None:
    # Omni returns uint8 images: within one level of rounding of the reference's floats.
    got = np.asarray(got) / 255
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1 / 255 + 1e-6


def test_two_stages_match_glm_image_pipeline(omni, reference):
    (out,) = omni.generate(PROMPTS[0], _params(7))
    assert out.stage == "dit" and out.error is None
    _close(out.images[0], reference_image(reference, PROMPTS[0], 7))
    prior = out.metrics["stages"]["prior"]
    assert prior["num_generated_tokens"] == prior_grid(SIDE, SIDE).num_new_tokens


def test_a_batch_of_three_matches_each_alone(omni, reference):
    # Both stages batch the three (the prior decodes them together, the DiT shares steps).
    outs = omni.generate(PROMPTS, [_params(11), _params(22), _params(33, num_inference_steps=2)])
    for out, prompt, seed, steps in zip(outs, PROMPTS, (11, 22, 33), (4, 4, 2)):
        _close(out.images[0], reference_image(reference, prompt, seed, num_inference_steps=steps))


def test_the_prior_runs_with_its_own_params_when_given(omni):
    # Per-stage params by stage name: a greedy prior makes the image independent of its seed.
    greedy = SamplingParams(temperature=0)
    a = omni.generate(PROMPTS[0], {"prior": greedy, "dit": _params(1)})[0]
    b = omni.generate(PROMPTS[0], {"prior": greedy, "dit": _params(1)})[0]
    assert np.array_equal(np.asarray(a.images[0]), np.asarray(b.images[0]))


@pytest.mark.parametrize("prompt, params, field", [
    ({"prompt": "a cat", "image": "<an image>"}, _params(1), "image"),
    ("a cat", _params(1, width=48), "width"),  # refused before the prior runs
])
def test_bad_inputs_are_refused_naming_the_field(omni, prompt, params, field):
    from omnistage.entrypoints.omni import OmniRequestError
    from omnistage.testing.diffusion_models import default_input_image

    if isinstance(prompt, dict):
        prompt = dict(prompt, image=default_input_image())
    with pytest.raises(OmniRequestError) as failed:
        omni.generate(prompt, params)
    out = failed.value.output
    assert (out.stage, out.error_kind, out.error_param) == ("prior", ErrorKind.INVALID_REQUEST, field)


def test_prepacked_linears_keep_the_prior_tokens(path, reference, monkeypatch):
    """On CPU the prior's linear layers run through oneDNN with prepacked weights
    (core/cpu_linear.py); the zoo model's are all below the size where that pays, so this
    packs every one of them: a seeded request still writes the reference's tokens."""
    from packed_linears import pack_every_linear

    pack_every_linear(monkeypatch)
    spec = resolve(path)
    rules = dict(spec.stages[0].defaults["default_sampling_params"])
    engine = AREngine(path, spec.stages[0], StageDeployConfig(max_num_seqs=1))
    assert not any(type(m) is torch.nn.Linear for m in engine.model.model.modules())
    engine.add_request(StageRequest("0", {"prompt": PROMPTS[0], "height": SIDE, "width": SIDE},
                                    SamplingParams(seed=3, **rules)))
    tokens = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens = out.payload.token_ids
    engine.close()
    want = reference_tokens(reference, PROMPTS[0], 3)
    assert tokens[:-1] == want[:-1]  # the last one is the image end, where the reference samples on
