"""FLUX.2-dev and FLUX.2-klein: our pipelines against diffusers' Flux2Pipeline and
Flux2KleinPipeline on the tiny zoo models (fp32, CPU), text-to-image and with reference images."""

from __future__ import annotations

import pytest

from parity import BATCH_PROMPTS, BATCH_SEEDS, ParityTests, assert_rejected

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.flux2.klein_pipeline import Flux2Klein
from omnistage.models.flux2.pipeline import Flux2
from omnistage.testing.diffusion_models import default_input_image
from omnistage.testing import call_kwargs as zoo_call_kwargs


def reference_images():
    """Two reference images of different sizes (each gets its own latent grid and time id)."""
    return [default_input_image(96).rotate(90), default_input_image()]


class Flux2Cases(ParityTests):
    """What both FLUX.2 variants are tested on beyond the shared parity tests."""

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls):
        return zoo_call_kwargs(cls.zoo_name)

    def test_input_images_are_checked(self, ours):
        # Reference images are optional; a too small one is refused by name.
        assert_rejected(ours, "image", DiffusionParams(height=64, width=64), [default_input_image(32)])

    def test_reference_images_match_diffusers(self, ours, expected, call):
        # Two reference images in one request, its size left to the first one's (96x96), and a
        # text-only request in the same batch.
        with_images = dict(call, prompt=BATCH_PROMPTS[1], image=reference_images(), height=None, width=None)
        self.assert_batch_matches(ours, expected, [with_images, dict(call, prompt=BATCH_PROMPTS[2])],
                                  seeds=BATCH_SEEDS[:2])

    def test_default_size_follows_the_first_reference_image(self, ours):
        images = [default_input_image(96).resize((96, 80)), default_input_image()]
        request = ours.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams(), images=images))
        assert (request.params.width, request.params.height) == (96, 80)

    @pytest.mark.parametrize("field, params", [
        ("height", DiffusionParams(height=40, width=64)),
        ("width", DiffusionParams(height=64, width=72)),
        ("max_sequence_length", DiffusionParams(height=64, width=64, extras={"max_sequence_length": 513})),
    ])
    def test_bad_inputs_are_rejected(self, ours, field, params):
        assert_rejected(ours, field, params)


class TestFlux2(Flux2Cases):
    zoo_name = "flux2"
    reference_class = "Flux2Pipeline"
    pipeline_class = Flux2

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, path):
        """diffusers' Flux2Pipeline with the checkpoint's tokenizer as its `tokenizer`.

        The checkpoint names a PixtralProcessor, which transformers 5.24 cannot even import
        without torchvision. For text it renders the chat template and tokenizes it without
        adding special tokens again, which is what the tokenizer's own apply_chat_template does."""
        from diffusers import Flux2Pipeline
        from transformers import AutoTokenizer

        loaded = Flux2Pipeline.from_pretrained(str(path), tokenizer=None)
        pipe = Flux2Pipeline(**dict(loaded.components,
                                    tokenizer=AutoTokenizer.from_pretrained(str(path), subfolder="tokenizer")))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def test_the_zoo_model_uses_the_guidance_embedding(self, ours):
        assert ours.transformer.config.guidance_embeds

    def test_batch_mixes_guidance_sizes_and_outputs(self, ours, expected, call):
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=2.5),
            dict(call, prompt=BATCH_PROMPTS[1], num_images_per_prompt=2),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=160),
        ])

    def test_defaults_come_from_the_checkpoint(self, ours):
        side = 128 * 2 ** (len(ours.vae.config.block_out_channels) - 1)
        params = ours.prepare_request(DiffusionRequest("r", "a cat", DiffusionParams())).params
        assert (params.height, params.width, params.num_inference_steps, params.guidance_scale) == (side, side, 50, 4.0)
        assert params.extras == {"max_sequence_length": 512}

    def test_negative_prompt_is_rejected(self, ours):
        # Guidance-distilled: a negative prompt would have no effect.
        assert_rejected(ours, "negative_prompt", DiffusionParams(height=64, width=64, negative_prompt="blurry"))


class TestFlux2Klein(Flux2Cases):
    zoo_name = "flux2-klein"
    reference_class = "Flux2KleinPipeline"
    pipeline_class = Flux2Klein
    staggered_short = {"guidance_scale": 1.0}  # the joining request alone runs no CFG

    def test_the_zoo_call_runs_true_cfg(self, ours, call):
        assert call["guidance_scale"] > 1 and not ours.is_distilled
        assert not ours.transformer.config.guidance_embeds

    def test_batch_mixes_cfg_sizes_and_outputs(self, ours, expected, call):
        self.assert_batch_matches(ours, expected, [
            dict(call, prompt=BATCH_PROMPTS[0], guidance_scale=1.0),
            dict(call, prompt=BATCH_PROMPTS[1], num_images_per_prompt=2, guidance_scale=2.5),
            dict(call, prompt=BATCH_PROMPTS[2], height=32, width=64, max_sequence_length=32),
        ])

    def test_a_distilled_checkpoint_refuses_cfg(self, path):
        from omnistage.diffusion.checkpoint import CheckpointConfigs

        configs = CheckpointConfigs.read(str(path))
        configs.pipeline["is_distilled"] = True
        checker = Flux2Klein.for_requests(configs)
        assert checker.prepare_params(DiffusionParams()).guidance_scale == 1.0
        assert_rejected(checker, "guidance_scale", DiffusionParams(height=64, width=64, guidance_scale=4.0))
