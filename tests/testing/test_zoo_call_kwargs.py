"""`omnistage.testing.call_kwargs`: the one registry of the zoo's reference calls (each
diffusion builder registers its family's call on its `ZooModel`)."""

from __future__ import annotations

import pytest

from omnistage.testing import call_kwargs, get_model, list_models

DIFFUSION = [m.name for m in list_models() if m.kind == "diffusion"]
LATENTS_ONLY = {"ltx2-latent-upsampler"}  # called with a first stage's latents: no prompt, no steps


def test_every_diffusion_family_registers_a_call():
    assert len(DIFFUSION) >= 15
    for name in DIFFUSION:
        model = get_model(name)
        if name in LATENTS_ONLY:
            assert model.call_kwargs and "prompt" not in model.call_kwargs, name
            continue
        assert model.call_kwargs["prompt"] and model.call_kwargs["num_inference_steps"] == 4, name
        if "height" in model.call_kwargs:  # the registered call is the tiny one
            assert model.call_kwargs["height"] == model.call_kwargs["width"] == model.sides["tiny"], name
            assert model.sides["small"] > model.sides["tiny"], name


@pytest.mark.parametrize("name, small_side", [("z-image", 256), ("flux2", 256), ("glm-image", 256), ("ltx2", 128),
                                              ("wan-t2v", 128), ("hunyuan-video", 128)])
def test_the_size_sets_height_and_width(name, small_side):
    tiny, small = call_kwargs(name), call_kwargs(name, "small")
    assert tiny == get_model(name).call_kwargs
    assert (small["height"], small["width"]) == (small_side, small_side)
    assert {k: v for k, v in small.items() if k not in ("height", "width")} == \
           {k: v for k, v in tiny.items() if k not in ("height", "width")}


def test_calls_without_a_size_keep_theirs():
    assert "height" not in call_kwargs("stable-audio", "small")  # audio: a length in seconds instead
    assert "height" not in call_kwargs("hunyuan-video-i2v", "small")  # sized by its input image's bucket


def test_each_call_is_a_fresh_copy():
    call = call_kwargs("ltx2")
    call["spatio_temporal_guidance_blocks"].append(0)
    call["num_inference_steps"] = 1
    assert call_kwargs("ltx2")["spatio_temporal_guidance_blocks"] == [1]
    assert call_kwargs("ltx2")["num_inference_steps"] == 4


def test_unknown_sizes_and_families_without_a_call_are_refused():
    with pytest.raises(ValueError, match="sizes"):
        call_kwargs("z-image", "huge")
    with pytest.raises(KeyError, match="no call kwargs"):
        call_kwargs("qwen2-llm")
