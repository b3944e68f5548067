"""Qwen-Image 2.1: our pipeline against diffusers' QwenImage21Pipeline on the tiny zoo model.

diffusers runs the text prefix through a KV cache filled at the first step (its default);
ours does the same per request and branch, so requests that join a running batch fill
their own cache while the others decode from theirs. The cache fill batches prompts of one
token length; the steps after it batch prompts of any length (the batch test's prompts
differ in length, so it covers that).
"""

from __future__ import annotations

import pytest

from parity import (BATCH_PROMPTS, BATCH_SEEDS, ParityTests, assert_all_close, assert_rejected, load_reference,
                    max_abs_diff, reference_arrays, run_arrays, run_staggered)

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.qwen_image.v21_pipeline import QwenImage21
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.diffusion_models import default_input_image
from omnistage.testing.qwen_image21_models import NAME

pytestmark = pytest.mark.slow

# Two prompts of one token length (checked below): their rows share transformer calls.
SAME_LENGTH_PROMPTS = ["a red cat", "a red dog"]


def count_transformer_calls(pipeline):
    """A list that grows by one per transformer call (a forward pre-hook; remove() it after)."""
    calls = []
    handle = pipeline.transformer.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls, handle


class TestQwenImage21(ParityTests):
    zoo_name = NAME
    reference_class = "QwenImage21Pipeline"
    pipeline_class = QwenImage21

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return zoo_call_kwargs(NAME)

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        from diffusers import QwenImage21Pipeline
        from transformers import Qwen3VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        return load_reference(QwenImage21Pipeline, path, processor=processor_from_parts(Qwen3VLProcessor, path))

    def test_the_zoo_call_runs_true_cfg(self, call):
        assert call["true_cfg_scale"] > 1 and call["negative_prompt"]

    def test_drops_the_system_turn_as_diffusers(self, ours, reference):
        assert ours.prompt_template_start_idx == reference._drop_idx

    def test_same_length_prompts_share_each_call(self, ours, expected, call):
        lengths = {len(ours.tokenizer(p).input_ids) for p in SAME_LENGTH_PROMPTS}
        assert len(lengths) == 1
        calls = [dict(call, prompt=p) for p in SAME_LENGTH_PROMPTS]
        requests = [self.request(c, s, f"r{i}") for i, (c, s) in enumerate(zip(calls, BATCH_SEEDS))]
        counted, handle = count_transformer_calls(ours)
        try:
            got = run_arrays(ours, requests)
        finally:
            handle.remove()
        # 4 steps x 2 branches, each one call for both requests (first the KV-cache fill).
        assert len(counted) == 4 * 2
        assert_all_close(got, [expected(c, s) for c, s in zip(calls, BATCH_SEEDS)])

    def test_mixed_lengths_share_the_cached_steps(self, ours, expected, call):
        calls = self.batch_calls(call)
        assert len({len(ours.tokenizer(p).input_ids) for p in BATCH_PROMPTS}) == 3
        counted, handle = count_transformer_calls(ours)
        try:
            self.assert_batch_matches(ours, expected, calls)
        finally:
            handle.remove()
        # Step 1: the cond cache fills one call per prompt length, the uncond one (one negative
        # prompt) one call; steps 2-4: one call per branch for all three.
        assert len(counted) == (3 + 1) + 3 * 2

    def test_join_while_others_decode_from_their_cache(self, ours, expected, call):
        # The same-length prompts again: the joiner fills its cache in its own call while the
        # running request decodes from its cache, then both share the cached calls.
        long_call = dict(call, prompt=SAME_LENGTH_PROMPTS[0], num_inference_steps=4)
        short_call = dict(call, prompt=SAME_LENGTH_PROMPTS[1], num_inference_steps=2)
        got = run_staggered(ours, self.request(long_call, 1, "long"), self.request(short_call, 2, "short"),
                            join_after=1)
        assert_all_close(got, [expected(long_call, 1), expected(short_call, 2)])

    def test_num_outputs_per_prompt(self, ours, expected, call):
        call = dict(call, num_images_per_prompt=2)
        (got,) = run_arrays(ours, [self.request(call, 3)])
        assert got.shape[0] == 2
        assert_all_close([got], [expected(call, 3)])

    def test_guidance_scale_is_refused(self, ours):
        assert_rejected(ours, "guidance_scale", DiffusionParams(height=64, width=64, guidance_scale=3.0))

    def test_checkpoint_sigma_schedule_fixes_the_step_count(self, path):
        configs = CheckpointConfigs.read(str(path))
        configs.pipeline["sample_sigmas"] = [1.0, 0.75, 0.5]
        checker = QwenImage21.for_requests(configs)
        request = checker.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=64)))
        assert request.params.num_inference_steps == 3
        with pytest.raises(ValueError, match="num_inference_steps"):
            checker.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams(num_inference_steps=4)))

    def test_checkpoint_sigma_schedule_matches_diffusers(self, ours, reference, call, path):
        # A checkpoint's model_index.json sample_sigmas replace the default schedule.
        sigmas = [1.0, 0.7, 0.4]
        configs = CheckpointConfigs.read(str(path))
        configs.pipeline["sample_sigmas"] = sigmas
        scheduled = QwenImage21(ours.components, configs=configs)
        reference.register_to_config(sample_sigmas=sigmas)
        try:
            want = reference_arrays(reference, dict(call, num_inference_steps=3), seed=6)
        finally:
            reference.register_to_config(sample_sigmas=None)
        (got,) = run_arrays(scheduled, [self.request(dict(call, num_inference_steps=3), 6)])
        assert max_abs_diff(got, want) <= 1e-3
        (default,) = run_arrays(ours, [self.request(dict(call, num_inference_steps=3), 6)])
        assert max_abs_diff(got, default) > 1e-3  # the schedule made a difference

    # -- condition images (2.1's image-conditioned mode) -----------------------------------------
    # The tiny processor reads 64x64 pixels: output_resolution 64 keeps the condition images at the
    # size whose vision tokens the VAE latents fill.

    @staticmethod
    def condition_call(call, **changes):
        from omnistage.testing.diffusion_models import default_input_image

        return {**call, "image": default_input_image(), "output_resolution": 64, **changes}

    def test_input_images_are_checked(self, ours):
        # Condition images are optional: a request with one and a request without are both taken.
        for images in ([], [default_input_image()]):
            ours.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams(), images=images))

    def test_condition_image_alone_matches_diffusers(self, ours, expected, call):
        call = self.condition_call(call)
        (got,) = run_arrays(ours, [self.request(call, 5)])
        assert max_abs_diff(got, expected(call, 5)) <= 1e-3
        (plain,) = run_arrays(ours, [self.request(dict(call, image=None), 5)])
        assert max_abs_diff(got, plain) > 2e-3  # the image conditions the output (weakly, at random weights)

    def test_condition_images_in_a_batch_match_each_alone(self, ours, expected, call):
        # Two images in one request (two outputs), one in the other, and a text-only request beside them.
        from PIL import Image

        flipped = default_input_image().transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        calls = [self.condition_call(call, prompt=BATCH_PROMPTS[0]),
                 self.condition_call(call, prompt=BATCH_PROMPTS[1], num_images_per_prompt=2,
                                     image=[flipped, default_input_image()]),
                 dict(call, prompt=BATCH_PROMPTS[2])]
        self.assert_batch_matches(ours, expected, calls)

    def test_condition_request_joins_a_running_one(self, ours, expected, call):
        long_call = self.condition_call(call, prompt=BATCH_PROMPTS[0], num_inference_steps=4)
        short_call = self.condition_call(call, prompt=BATCH_PROMPTS[1], num_inference_steps=2)
        self.assert_staggered_matches(ours, expected, long_call, short_call)
