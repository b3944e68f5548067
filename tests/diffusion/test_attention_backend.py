"""`attention_backend`: diffusers' dispatcher backends by our names; the unknown and the
unavailable are refused with the list of those this machine can run."""

from __future__ import annotations

import numpy as np
import pytest

from omnistage.diffusion.accel import attention_backend

from accel_common import load, run


def test_sdpa_is_always_available():
    assert attention_backend.available_backends()[0] == "sdpa"


def test_math_backend_matches_default_and_is_set_on_every_processor(zoo):
    path = zoo("z-image")
    plain = load("z-image", path)
    math = load("z-image", path, attention_backend="sdpa_math")
    assert math.accelerations == ["attention_backend"]
    assert attention_backend.active_backends(plain) == {None}
    assert attention_backend.active_backends(math) == {"_native_math"}
    np.testing.assert_allclose(run(math, "z-image"), run(plain, "z-image"), atol=1e-4)


def test_unknown_backend_lists_the_available_ones(zoo):
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; available here: sdpa, sdpa_math"):
        load("z-image", zoo("z-image"), attention_backend="nope")


@pytest.mark.skipif(attention_backend.is_available("flash_attn"), reason="flash-attn is installed here")
def test_unavailable_backend_says_what_it_needs(zoo):
    with pytest.raises(ValueError, match=r"'flash_attn' needs the flash_attn package.*available here: sdpa"):
        load("z-image", zoo("z-image"), attention_backend="flash_attn")


def test_family_without_dispatched_attention_is_refused_by_name(zoo):
    with pytest.raises(ValueError, match="StableDiffusion3Pipeline's attention does not go through"):
        load("sd3", zoo("sd3"), attention_backend="sdpa_math")
