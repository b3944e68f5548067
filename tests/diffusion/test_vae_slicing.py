"""`vae_use_slicing`: a batch of requests decoded together goes through the VAE's decoder one
sample at a time (diffusers' slicing) and gives the batched decode's output, for an image VAE
(AutoencoderKL: Z-Image) and a causal one (Qwen-Image's, which decodes a frame per call)."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import request_for

FAMILIES = {"z-image": "ZImagePipeline", "qwen-image": "QwenImagePipeline"}
TOLERANCE = 1e-5
"""Float rounding only: a sample's convolutions run alone instead of in a batch of two."""


def batch_sizes(module) -> list[int]:
    sizes: list[int] = []
    module.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    return sizes


@pytest.mark.parametrize("name", list(FAMILIES))
def test_sliced_decode_runs_one_sample_at_a_time_with_the_batched_output(zoo, name):
    pipeline = pipeline_class(FAMILIES[name]).from_pretrained(str(zoo(name)),
                                                                deploy=StageDeployConfig(vae_use_slicing=True))
    assert pipeline.accelerations == ["vae_slicing"] and pipeline.vae.use_slicing
    call = {**zoo_call_kwargs(name), "num_inference_steps": 2}
    states = pipeline.denoise([request_for(call, seed=1, request_id="a"),
                               request_for({**call, "prompt": "a red fox"}, seed=2, request_id="b")])
    sizes = batch_sizes(pipeline.vae.decoder)
    sliced = pipeline.decode_arrays(states)
    assert sizes and set(sizes) == {1}  # every decoder call saw one sample
    pipeline.vae.disable_slicing()
    sizes.clear()
    batched = pipeline.decode_arrays(states)
    assert set(sizes) == {2}  # without slicing the two requests share each call
    for one, other in zip(sliced, batched, strict=True):
        assert np.abs(one - other).max() <= TOLERANCE


def test_taken_with_vae_tiling_and_refused_by_name_without_it():
    from omnistage.diffusion.accel.declaration import NONE, check_declared

    deploy = StageDeployConfig(vae_use_slicing=True)
    cls = pipeline_class("QwenImage21Pipeline")  # declares vae_tiling: takes slicing too
    check_declared(cls.reference_class, cls.supported_accelerations, deploy)
    with pytest.raises(ValueError, match="vae_use_slicing=True: OmniVoice cannot take it"):
        check_declared("OmniVoice", NONE, deploy)  # a pipeline without a VAE declares nothing
