"""Omni / AsyncOmni on real zoo checkpoints: Z-Image alone, and the two-model
prompt_expand_image pipeline (qwen2-llm expands the prompt, Z-Image draws it) with its
drawer in its own process, payloads through shared memory."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistage import DiffusionParams, Omni, OmniRequestError, SamplingParams

pytestmark = pytest.mark.slow

DRAW = DiffusionParams(num_inference_steps=2, height=32, width=32, seed=3)


@pytest.fixture(scope="module")
def zimage(zoo):
    with Omni(zoo("z-image")) as omni:
        yield omni


@pytest.fixture(scope="module")
def expand(zoo, tmp_path_factory):
    from omnistage.models.prompt_expand_image import write_pipeline_folder

    root = tmp_path_factory.mktemp("expand")
    folder = write_pipeline_folder(root / "model", expander=zoo("qwen2-llm"), drawer=zoo("z-image"))
    deploy = root / "deploy.yaml"
    deploy.write_text("connector: shm\nstages:\n  - id: 1\n    runtime: process\n")
    with Omni(folder, deploy) as omni:
        yield omni


def test_z_image_single_stage(zimage):
    assert zimage.async_omni.config.pipeline_key == "ZImagePipeline"
    outs = zimage.generate(["a cat", "a dog"], DRAW, use_tqdm=False)
    assert [o.images[0].size for o in outs] == [(32, 32), (32, 32)]
    assert all(o.text is None and o.audio is None and o.video is None for o in outs)
    stage = outs[0].metrics["stages"]["diffusion"]
    assert stage["num_steps"] == 2 and stage["seed"] == 3 and stage["run_time"] > 0
    from prometheus_client import generate_latest

    exported = generate_latest(zimage.async_omni.metrics_registry).decode()
    assert 'omnistage_stage_batch_size_count{pipeline=' in exported


def test_offline_progress_bar_follows_denoising_steps(zimage, capsys):
    zimage.generate(["a cat", "a dog"], DRAW, use_tqdm=True)
    bar = capsys.readouterr().err
    assert "2/2" in bar and "denoising steps 4/4" in bar


def test_expanded_text_is_what_z_image_draws(expand, zimage):
    config = expand.async_omni.config
    assert (config.pipeline_key, config.resolved_by) == ("prompt_expand_image", "config.json model_type")
    params = {"expander": SamplingParams(max_tokens=8, ignore_eos=True, seed=0), "drawer": DRAW}
    [out] = expand.generate("a cat", params, use_tqdm=False)
    assert out.text.strip() and len(out.token_ids) == 8 and out.images[0].size == (32, 32)
    stages = out.metrics["stages"]
    assert stages["expander"]["finish_time"] <= stages["drawer"]["start_time"]
    # the same prompt and seed through Z-Image alone gives the same picture
    [alone] = zimage.generate(out.text.strip(), DRAW, use_tqdm=False)
    assert np.array_equal(np.asarray(alone.images[0]), np.asarray(out.images[0]))


def test_stream_then_abort_mid_request(expand):
    async def main():
        short = {"expander": SamplingParams(max_tokens=6, ignore_eos=True, seed=1), "drawer": DRAW}
        streamed = [out async for out in expand.async_omni.generate({"prompt": "a boat"}, short)]
        long = {"expander": SamplingParams(max_tokens=500, ignore_eos=True), "drawer": DRAW}
        aborted = []
        async for out in expand.async_omni.generate("a tree", long, request_id="long"):
            aborted.append(out)
            if len(aborted) == 2:
                await expand.async_omni.abort("long")
        return streamed, aborted

    streamed, aborted = asyncio.run(main())
    kinds = ["text" if o.text_delta else "progress" if o.progress else "final" for o in streamed]
    assert kinds[-1] == "final" and kinds.index("progress") > kinds.index("text")
    assert "".join(o.text_delta or "" for o in streamed) == streamed[-1].text
    assert aborted[-1].finished and aborted[-1].finish_reason == "abort"
    assert "drawer" not in aborted[-1].metrics["stages"]
    assert asyncio.run(expand.async_omni.check_health())


def test_a_failing_input_processor_fails_only_its_request(expand):
    params = {"expander": SamplingParams(max_tokens=8, ignore_eos=True, seed=0), "drawer": DRAW}  # seeded: never blank
    with pytest.raises(OmniRequestError) as info:
        expand.generate(["a cat", {"prompt": "  "}], params, use_tqdm=False)
    good, bad = info.value.outputs
    assert bad.error.startswith("stage 0 (expander): input_processor raised ValueError: prompt must be a non-empty")
    assert good.error is None and good.images


def test_per_prompt_params_give_each_prompt_its_own_seed(zimage):
    seeds = [DRAW, DRAW.model_copy(update={"seed": 4}), DRAW]
    outs = zimage.generate(["a cat"] * 3, seeds, use_tqdm=False)
    pixels = [np.asarray(o.images[0]) for o in outs]
    assert np.array_equal(pixels[0], pixels[2]) and not np.array_equal(pixels[0], pixels[1])
    [alone] = zimage.generate("a cat", DRAW.model_copy(update={"seed": 4}), use_tqdm=False)
    assert np.array_equal(np.asarray(alone.images[0]), pixels[1])  # the same as its own request


@pytest.mark.parametrize("runtime", ["inline", "process"])
def test_abort_stops_a_running_diffusion_request_within_a_step(zoo, runtime):
    """AsyncOmni on a real Z-Image stage, inline and in its own process: progress streams
    while a 1000-step request runs, `abort` answers it with finish_reason "abort" and no
    media, and the stage is free for the next request at once (it does not run the rest)."""
    from omnistage import AsyncOmni

    async def scenario():
        async with AsyncOmni(zoo("z-image"), runtime=runtime) as omni:
            steps = []
            long = DiffusionParams(num_inference_steps=1000, height=32, width=32, seed=1)
            async for out in omni.generate("a slow one", long, request_id="long"):
                if out.progress is not None:
                    steps.append(out.progress.step)
                    if len(steps) == 3:
                        await omni.abort("long")
                if out.finished:
                    final = out
                    break
            assert steps[:3] == [1, 2, 3] and final.finish_reason == "abort" and final.images is None
            loop = asyncio.get_running_loop()
            start = loop.time()
            async for out in omni.generate("next", DRAW, request_id="next"):
                last = out
            assert last.finished and last.images and loop.time() - start < 30
        return steps

    steps = asyncio.run(scenario())
    assert max(steps) < 100  # it stopped near the abort, far from step 1000
