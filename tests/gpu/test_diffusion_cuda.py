"""Diffusion pipelines on CUDA: fp32 parity with diffusers on the same device (alone and in
a batch of three), and a bf16 smoke test (finite, right shape, close to fp32 by PSNR).

Z-Image, Qwen-Image and Flux on the zoo's tiny checkpoints. Both sides draw their noise
from a CPU generator (diffusers' tests do the same), so the starting latents are equal
whatever the device, and any difference comes from the device and dtype paths."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from parity import BATCH_PROMPTS, BATCH_SEEDS, TOLERANCE, load_reference, max_abs_diff, reference_arrays, request_for, run_arrays

from omnistage.models.flux.pipeline import Flux
from omnistage.models.qwen_image.pipeline import QwenImage
from omnistage.models.z_image.pipeline import ZImage
from omnistage.testing import call_kwargs as zoo_call_kwargs

pytestmark = pytest.mark.gpu

FAMILIES = {
    "z-image": ("ZImagePipeline", ZImage),
    "qwen-image": ("QwenImagePipeline", QwenImage),
    "flux": ("FluxPipeline", Flux),
}
SEED = 0

PSNR_FLOOR_DB = 15.0
"""bf16 against fp32, same weights and noise. On random tiny weights the picture means
nothing, but the comparison still does: bf16 keeps ~3 significant digits, which over a
few denoising steps and the VAE typically lands in the 30-45 dB range. 15 dB (an RMS error
of 18% of the full range) only fails for a broken bf16 path (a wrong scale, a dtype mixed
up between latents and model, overflow), never for honest rounding."""


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two float images in [0, 1], in dB (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(1.0 / mse)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, zoo):
    """(name, zoo path, diffusers fp32 on cuda, ours fp32 on cuda) for one family."""
    import diffusers

    name = request.param
    reference_class, ours_class = FAMILIES[name]
    path = zoo(name)
    reference = load_reference(getattr(diffusers, reference_class), path).to("cuda")
    ours = ours_class.from_pretrained(path, device="cuda", dtype=torch.float32)
    assert ours.device.type == "cuda" and next(ours.transformer.parameters()).is_cuda
    yield name, path, reference, ours
    del reference, ours
    torch.cuda.empty_cache()


def test_fp32_alone_matches_diffusers_on_cuda(family, report):
    name, _, reference, ours = family
    call = zoo_call_kwargs(name)
    (got,) = run_arrays(ours, [request_for(call, SEED)])
    want = reference_arrays(reference, call, SEED)
    diff = max_abs_diff(got, want)
    report(f"diffusion_fp32_alone[{name}]", max_abs_diff=diff)
    assert diff <= TOLERANCE


def test_fp32_batch_of_three_matches_diffusers_on_cuda(family, report):
    name, _, reference, ours = family
    calls = [dict(zoo_call_kwargs(name), prompt=p) for p in BATCH_PROMPTS]
    got = run_arrays(ours, [request_for(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))])
    diffs = [max_abs_diff(g, reference_arrays(reference, c, s)) for g, c, s in zip(got, calls, BATCH_SEEDS)]
    report(f"diffusion_fp32_batch3[{name}]", max_abs_diff=max(diffs))
    assert max(diffs) <= TOLERANCE


def test_bf16_is_finite_and_close_to_fp32(family, report):
    name, path, _, ours_fp32 = family
    _, ours_class = FAMILIES[name]
    ours_bf16 = ours_class.from_pretrained(path, device="cuda", dtype=torch.bfloat16)
    assert next(ours_bf16.transformer.parameters()).dtype == torch.bfloat16
    call = zoo_call_kwargs(name)
    (bf16,) = run_arrays(ours_bf16, [request_for(call, SEED)])
    (fp32,) = run_arrays(ours_fp32, [request_for(call, SEED)])
    assert bf16.shape == fp32.shape
    assert np.isfinite(bf16).all()
    value = psnr(bf16, fp32)
    report(f"diffusion_bf16_psnr_vs_fp32[{name}]", psnr_db=value, max_abs_diff=max_abs_diff(bf16, fp32))
    assert value > PSNR_FLOOR_DB
