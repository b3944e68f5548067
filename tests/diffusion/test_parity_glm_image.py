"""GLM-Image's DiT stage against diffusers' GlmImagePipeline given the same prior tokens (fp32, CPU).

diffusers' pipeline takes `prior_token_ids=` and then skips its AR prior, so these tests
compare the DiT, glyph encoder, schedule and VAE alone, on seeded random image codes; the
AR prior and the two stages together are in tests/models/test_glm_image.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from parity import BATCH_PROMPTS, ParityTests, assert_rejected, request_for

from omnistage.diffusion.params import DiffusionParams
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.glm_image.grid import prior_grid
from omnistage.models.glm_image.pipeline import GlmImage
from omnistage.testing import call_kwargs as zoo_call_kwargs
from omnistage.testing.glm_image_models import NUM_CODES

# A prompt with quoted text: the glyph encoder reads it, so its embeddings are longer.
GLYPH_PROMPT = 'a shop sign that says "open all night"'


def prior_tokens(seed: int, height: int = 64, width: int = 64) -> torch.Tensor:
    """Seeded random image codes for a height x width image, as diffusers' prior_token_ids [1, N]."""
    grid = prior_grid(height, width)
    codes = torch.randint(0, NUM_CODES, (grid.num_target_tokens,), generator=torch.Generator().manual_seed(seed))
    return torch.tensor([grid.dit_prior_tokens([0] * grid.num_preview_tokens + codes.tolist())])


def dit_request(call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
    """Our request for a reference call: its prior_token_ids go in the request's condition."""
    kwargs = dict(call_kwargs)
    prior = kwargs.pop("prior_token_ids")
    request = request_for(kwargs, seed, request_id)
    request.condition["prior_token_ids"] = prior[0].tolist()
    return request


class TestGlmImageDiT(ParityTests):
    zoo_name = "glm-image"
    reference_class = "GlmImagePipeline"
    pipeline_class = GlmImage

    @pytest.fixture(scope="class")
    @classmethod
    def call(cls) -> dict[str, Any]:
        return dict(zoo_call_kwargs("glm-image"), prior_token_ids=prior_tokens(0))

    def request(self, call_kwargs: dict[str, Any], seed: int, request_id: str = "req") -> DiffusionRequest:
        return dit_request(call_kwargs, seed, request_id)

    def batch_calls(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        # Different prior tokens and prompts; the glyph prompt forms its own transformer call.
        prompts = [BATCH_PROMPTS[0], GLYPH_PROMPT, BATCH_PROMPTS[2]]
        return [dict(call, prompt=p, prior_token_ids=prior_tokens(i + 1)) for i, p in enumerate(prompts)]

    def test_batch_mixes_cfg_sizes_and_outputs(self, ours, expected, call):
        self.assert_batch_matches(ours, expected, [
            dict(call, guidance_scale=1.0),  # CFG off: no uncond branch
            dict(call, prompt=GLYPH_PROMPT, num_images_per_prompt=2),
            dict(call, height=32, width=64, prior_token_ids=prior_tokens(5, 32, 64)),  # its own group
        ])

    def test_defaults_are_the_reference_call_defaults(self, ours):
        params = ours.prepare_params(DiffusionParams())
        assert (params.num_inference_steps, params.guidance_scale) == (50, 1.5)
        assert params.extras == {"max_sequence_length": 2048}

    def test_a_request_needs_the_prior_tokens(self, ours):
        assert_rejected(ours, "prior_token_ids", DiffusionParams(height=64, width=64))

    def test_prior_tokens_must_fit_the_size(self, ours):
        request = DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=96),
                                   condition={"prior_token_ids": prior_tokens(0)[0].tolist()})
        with pytest.raises(ValueError, match="prior_token_ids: 16 tokens do not fit a 64x96"):
            ours.prepare_request(request)

    def test_prior_tokens_must_be_image_codes(self, ours):
        request = DiffusionRequest("r", "a cat", DiffusionParams(height=64, width=64),
                                   condition={"prior_token_ids": [NUM_CODES] * 16})
        with pytest.raises(ValueError, match="prior_token_ids must be image codes"):
            ours.prepare_request(request)

    def test_size_not_divisible_is_rejected(self, ours):
        assert_rejected(ours, "width", DiffusionParams(height=64, width=48))
