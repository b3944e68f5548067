"""LTX-2 two-stage: our base -> latent upsampler -> refiner stages against diffusers' chained
LTX2Pipeline(output_type="latent") -> LTX2LatentUpsamplePipeline(latents=) -> LTX2Pipeline(latents=,
audio_latents=, noise_scale=, sigmas=STAGE_2_DISTILLED_SIGMA_VALUES) with one generator through the
chain, as diffusers' LTX-2 docs do, on the tiny zoo models (fp32, CPU): the distilled recipe alone,
two in a batch and the refiner staggered in step mode; the three stages through `Omni` on a
pipeline folder; the upsampler alone; the schedules; and the `ltx2_two_stage` deploy file."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from parity import BATCH_PROMPTS, BATCH_SEEDS, TOLERANCE, assert_all_close, av_request, load_reference, max_abs_diff

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.ltx2 import base_input, refiner_input, upsampler_input
from omnistage.models.ltx2.pipeline import LTX2I2V, LTX2T2V
from omnistage.models.ltx2.upsample import LTX2LatentUpsample
from omnistage.testing import call_kwargs

# One transformer pass a step (no CFG, STG or modality isolation) keeps the chain cheap; the
# guidance passes are LTX2Pipeline's own, tested in test_parity_ltx2.py.
CALL = dict(call_kwargs("ltx2"), guidance_scale=1.0, stg_scale=0.0, modality_scale=1.0, num_inference_steps=2,
            num_frames=5)
# The batch test's calls (one at another length: its own group), which the staggered and the Omni
# tests reuse, so the module's cached reference chains serve them all.
CALLS = [dict(CALL, prompt=BATCH_PROMPTS[0]), dict(CALL, prompt=BATCH_PROMPTS[1], num_frames=9)]
DISTILLED = {"schedule": "distilled", "num_inference_steps": 8}


@pytest.fixture(scope="module")
def paths(zoo):
    return zoo("ltx2"), zoo("ltx2-latent-upsampler")


@pytest.fixture(scope="module")
def ours(paths):
    return LTX2T2V.from_pretrained(paths[0]), LTX2LatentUpsample.from_pretrained(paths[1])


@pytest.fixture(scope="module")
def reference(paths):
    from diffusers import FlowMatchEulerDiscreteScheduler, LTX2LatentUpsamplePipeline, LTX2Pipeline

    base = load_reference(LTX2Pipeline, paths[0])
    # The fixed (distilled) sigmas run as they are: diffusers' recipe swaps in this scheduler.
    as_is = FlowMatchEulerDiscreteScheduler.from_config(base.scheduler.config, use_dynamic_shifting=False,
                                                        shift_terminal=None)
    fixed = LTX2Pipeline(**{**base.components, "scheduler": as_is})
    fixed.set_progress_bar_config(disable=True)
    return base, fixed, load_reference(LTX2LatentUpsamplePipeline, paths[1])


@pytest.fixture(scope="module")
def expected(reference):
    """`get(call, seed)`: diffusers' chain's video [F, H, W, 3] and audio, computed once per (call, seed)."""
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES, STAGE_2_DISTILLED_SIGMA_VALUES

    base, fixed, upsampler = reference
    cache: dict = {}

    def get(call: dict, seed: int) -> tuple[np.ndarray, np.ndarray]:
        key = (seed, json.dumps(call, sort_keys=True))
        if key not in cache:
            generator = torch.Generator("cpu").manual_seed(seed)
            first = dict(call)
            if first.pop("schedule", None) == "distilled":
                first_stage = lambda **kw: fixed(**kw, sigmas=DISTILLED_SIGMA_VALUES)  # noqa: E731
            else:
                first_stage = base
            video, audio = first_stage(**first, generator=generator, output_type="latent", return_dict=False)
            video = upsampler(latents=video, output_type="latent", return_dict=False)[0]
            second = {k: v for k, v in first.items() if k not in ("height", "width", "num_frames")}
            second["num_inference_steps"] = len(STAGE_2_DISTILLED_SIGMA_VALUES)
            frames, audio_out = fixed(**second, latents=video, audio_latents=audio, sigmas=STAGE_2_DISTILLED_SIGMA_VALUES,
                                      noise_scale=STAGE_2_DISTILLED_SIGMA_VALUES[0], generator=generator,
                                      output_type="np", return_dict=False)
            cache[key] = frames[0], audio_out[0].numpy()
        return cache[key]

    return get


def _chain_requests(ours, calls: list[dict], seeds: list[int]) -> list[DiffusionRequest]:
    """Our base on every call in one batch, our upsampler on its latents in one batch, then the
    refiner's requests, each stage's request built by the two-stage pipeline's input processors."""
    base, upsampler = ours

    def stage_request(inputs: dict, call: dict, seed: int, i: int) -> DiffusionRequest:
        request = av_request({**call, "prompt": inputs["prompt"]}, seed, f"r{i}")
        request.condition.update(inputs["condition"])
        return request

    users = [SimpleNamespace(prompt=c["prompt"]) for c in calls]
    firsts = [stage_request(base_input(u, {}), c, s, i) for i, (u, c, s) in enumerate(zip(users, calls, seeds))]
    latents = base.forward(firsts)
    ups = [DiffusionRequest(f"u{i}", u.prompt, DiffusionParams(seed=s), condition=upsampler_input(u, {0: p})["condition"])
           for i, (u, p, s) in enumerate(zip(users, latents, seeds))]
    upsampled = upsampler.forward(ups)
    refine = {k: v for k, v in CALL.items() if k != "num_inference_steps"}
    return [stage_request(refiner_input(u, {1: p}), {**refine, "schedule": "distilled_stage_2", "prompt": u.prompt},
                          s, i) for i, (u, p, s) in enumerate(zip(users, upsampled, seeds))]


def test_distilled_two_stage_alone_matches_diffusers(ours, expected):
    call = dict(CALL, prompt=BATCH_PROMPTS[0], **DISTILLED)
    (request,) = _chain_requests(ours, [call], [BATCH_SEEDS[0]])
    ((video, audio),) = ours[0].decode_av(ours[0].denoise([request]))
    want_video, want_audio = expected(call, BATCH_SEEDS[0])
    assert video.shape == (5, 128, 128, 3)  # twice the asked 64 x 64
    assert max_abs_diff(video, want_video) <= TOLERANCE and max_abs_diff(audio, want_audio) <= TOLERANCE


def test_batch_of_two_matches_each_alone(ours, expected):
    requests = _chain_requests(ours, CALLS, BATCH_SEEDS[:2])
    got = ours[0].decode_arrays(ours[0].denoise(requests))
    assert_all_close(got, [expected(c, s)[0] for c, s in zip(CALLS, BATCH_SEEDS)])


def test_staggered_refiner_requests_share_steps(ours, expected):
    from parity import run_staggered

    first, second = _chain_requests(ours, CALLS, BATCH_SEEDS[:2])
    got = run_staggered(ours[0], first, second, join_after=1)
    assert_all_close(got, [expected(c, s)[0] for c, s in zip(CALLS, BATCH_SEEDS)])


def test_the_three_stages_through_omni(two_stage_folder, expected):
    # The stage graph end to end: latents, audio latents and the generator handed from stage to stage.
    from omnistage import Omni

    call, seed = CALLS[0], BATCH_SEEDS[0]
    base = av_request(call, seed).params
    params = {"base": base, "upsampler": DiffusionParams(seed=seed),
              "refiner": base.model_copy(update={"num_inference_steps": None})}  # the deploy's schedule
    with Omni(str(two_stage_folder)) as omni:
        (out,) = omni.generate([call["prompt"]], params, use_tqdm=False)
    want = expected(call, seed)[0]
    assert out.video.shape == want.shape and np.abs(out.video / 255 - want).max() <= 1 / 255 + 1e-6


def test_upsampler_alone_matches_diffusers(ours, reference):
    # The upsampler's own output (decoded by the VAE), with AdaIN and tone mapping, two in one call.
    latents = [torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    extras = {"adain_factor": 0.5, "tone_map_compression_ratio": 0.3}
    requests = [DiffusionRequest(f"u{i}", "", DiffusionParams(seed=0, extras=extras), condition={"latents": x})
                for i, x in enumerate(latents)]
    states = ours[1].denoise(requests)
    assert [s.num_forwards for s in states] == [1, 1]
    want = [reference[2](latents=x, output_type="np", **extras).frames[0] for x in latents]
    assert_all_close(ours[1].decode_arrays(states), want)


def test_distilled_schedules_are_the_fixed_sigmas_unshifted(ours):
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

    base = ours[0]
    (state,) = base.encode([base.prepare_request(av_request(dict(CALL, schedule="distilled",
                                                                 num_inference_steps=None), 0))])
    assert state.num_steps == 8 == len(DISTILLED_SIGMA_VALUES)
    np.testing.assert_allclose(state.noise_scheduler.sigmas[:-1].numpy(), DISTILLED_SIGMA_VALUES, rtol=1e-6)
    (shifted,) = base.encode([base.prepare_request(av_request(dict(CALL, num_inference_steps=8), 0))])
    assert not np.allclose(shifted.noise_scheduler.sigmas[:-1].numpy(), DISTILLED_SIGMA_VALUES)


@pytest.mark.parametrize("which, condition, extras, field", [
    ("upsampler", {}, {}, "condition"),
    ("upsampler", {"latents": torch.zeros(1, 3, 2, 4, 4)}, {}, "condition"),  # the zoo's latents have 4 channels
    ("base", {}, {"noise_scale": 0.5}, "noise_scale"),  # only with input latents
    ("base", {}, {"schedule": "distilled_stage_2", "num_inference_steps": 4}, "num_inference_steps"),
    ("base", {}, {"schedule": "turbo"}, "schedule"),
    ("base", {"latents": torch.zeros(1, 4, 8, 8)}, {}, "condition"),
])
def test_bad_inputs_are_rejected(ours, which, condition, extras, field):
    pipeline = ours[0] if which == "base" else ours[1]
    steps = extras.pop("num_inference_steps", None)
    request = DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=64, num_frames=9, extras=extras,
                                                             num_inference_steps=steps), condition=condition)
    with pytest.raises(ValueError, match=field):
        pipeline.prepare_request(request)


def test_image_to_video_takes_no_input_latents(paths):
    from PIL import Image

    checker = LTX2I2V.for_requests(CheckpointConfigs.read(str(paths[0])))
    request = DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=64, num_frames=9),
                               images=[Image.new("RGB", (64, 64))], condition={"latents": torch.zeros(1, 4, 5, 2, 2)})
    with pytest.raises(ValueError, match="condition"):
        checker.prepare_request(request)


@pytest.fixture(scope="module")
def two_stage_folder(paths, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ltx2") / "two-stage"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "ltx2_two_stage", "stage_models": {
        "base": str(paths[0]), "upsampler": str(paths[1]), "refiner": str(paths[0])}}))
    return folder


def test_the_deploy_file_selects_base_upsampler_refiner(paths, two_stage_folder):
    from omnistage.config.effective import resolve_config
    from omnistage.engine.factory import stage_model_paths

    config = resolve_config(two_stage_folder)
    assert [(s.name, s.model, s.output) for s in config.pipeline.stages] == [
        ("base", "LTX2Pipeline", "latent"), ("upsampler", "LTX2LatentUpsamplePipeline", "latent"),
        ("refiner", "LTX2Pipeline", "video")]
    assert config.stage_config(2).default_sampling_params == {"guidance_scale": 1.0,
                                                              "extras": {"schedule": "distilled_stage_2"}}
    assert stage_model_paths(str(two_stage_folder), config.pipeline) == {0: str(paths[0]), 1: str(paths[1]),
                                                                         2: str(paths[0])}
