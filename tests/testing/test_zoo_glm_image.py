"""The GLM-Image zoo checkpoint: one diffusers folder that diffusers' own loader reads as a
GlmImagePipeline (the parity tests generate with it) and that builds byte for byte the same."""

from __future__ import annotations

from omnistage.testing import build
from omnistage.testing.glm_image_models import NUM_CODES

from test_zoo_diffusion import file_digests


def test_diffusers_loads_it_as_glm_image(zoo):
    from diffusers import DiffusionPipeline, GlmImagePipeline

    pipe = DiffusionPipeline.from_pretrained(zoo("glm-image"))
    assert type(pipe) is GlmImagePipeline
    # The AR model's vocabulary keeps the real layout: codes, then the image start / end tokens.
    config = pipe.vision_language_encoder.config
    assert (config.image_start_token_id, config.image_end_token_id) == (NUM_CODES, NUM_CODES + 1)
    assert pipe.transformer.config.prior_vq_quantizer_codebook_size == config.vq_config.num_embeddings == NUM_CODES


def test_small_builds_and_is_deterministic(tmp_path):
    first = file_digests(build("glm-image", tmp_path / "a", size="small"))
    again = file_digests(build("glm-image", tmp_path / "b", size="small"))
    assert first == again and any(k.endswith(".safetensors") for k in first)
