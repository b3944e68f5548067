"""FLUX.2-klein: FLUX.2 (pipeline.py) with a Qwen3 text encoder (hidden states of layers 9,
18 and 27, its chat template with thinking off) and true CFG instead of the guidance embedding.

Reproduces `diffusers.Flux2KleinPipeline` (pipelines/flux2/pipeline_flux2_klein.py). The base
checkpoints run a second pass on the negative prompt ("" unless the request gives one) when
`guidance_scale > 1`; step-distilled ones (model_index.json `is_distilled`) run none and
refuse a `guidance_scale` above 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, plain_cfg, scale_if_negative
from omnistage.diffusion.request import DiffusionRequest
from omnistage.models.flux2.pipeline import Flux2
from omnistage.diffusion.accel.declaration import Accelerations


class Flux2Klein(Flux2):
    """FLUX.2-klein: FLUX.2 with a Qwen3 text encoder and true CFG instead of the guidance
    embedding."""

    reference_class: ClassVar[str] = "Flux2KleinPipeline"
    supported_accelerations: ClassVar[Accelerations] = dataclasses.replace(
        Flux2.supported_accelerations, cfg_parallel=True, refused={})
    text_encoder_out_layers: ClassVar[tuple[int, ...]] = (9, 18, 27)
    loader_overrides: ClassVar[dict[str, Any]] = {}
    takes_negative_prompt: ClassVar[bool] = True

    @classmethod
    def from_diffusers(cls, pipe: Any, path: str, configs: CheckpointConfigs, device: torch.device | str,
                       dtype: torch.dtype) -> "Flux2Klein":
        return cls(pipe.components, device, dtype, configs)

    def configure(self, configs: CheckpointConfigs) -> None:
        super().configure(configs)
        # Step-distilled checkpoints take no CFG (model_index.json `is_distilled`).
        self.is_distilled = bool(configs.pipeline.get("is_distilled", False))
        if self.is_distilled:
            self.default_params = {**type(self).default_params, "guidance_scale": 1.0}

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        scale = request.params.guidance_scale
        if self.is_distilled and scale > 1:
            # diffusers warns and ignores it; we refuse, so the user knows it has no effect.
            raise RequestError("guidance_scale", f"guidance_scale: this checkpoint is step-distilled and runs no CFG; "
                               f"guidance_scale must be <= 1, got {scale}")

    def uses_cfg(self, request: DiffusionRequest) -> bool:
        return request.params.guidance_scale > 1 and not self.is_distilled

    def _chat_texts(self, prompts: list[str]) -> list[str]:
        # Flux2KleinPipeline._get_qwen3_prompt_embeds: one user turn, thinking off.
        return [self.tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                   add_generation_prompt=True, enable_thinking=False)
                for p in prompts]

    def _tokenize(self, texts: list[str], max_sequence_length: int) -> dict[str, torch.Tensor]:
        return self.tokenizer(texts, padding="max_length", truncation=True, max_length=max_sequence_length,
                              return_tensors="pt")

    # True CFG on the negative prompt ("" unless given) when the request runs it; each branch
    # its own transformer call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=plain_cfg)
