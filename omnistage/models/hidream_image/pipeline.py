"""HiDream-I1: two long-context CLIP encoders (pooled), T5 and Llama-3.1 (every layer's hidden
states) for the text, a sparse-MoE MMDiT over 2x2 latent patches, FLUX.1's VAE.

Reproduces `diffusers.HiDreamImagePipeline` (pipelines/hidream_image/pipeline_hidream_image.py),
split at the encode / denoise_step / decode seams. Every prompt is padded to a fixed length per
encoder (CLIP: min(max_sequence_length, 218); T5 and Llama: max_sequence_length), so a prompt's
embeddings are the same in a batch as alone. The transformer predicts the negated velocity. CFG
runs when `guidance_scale > 1`, on the negative prompt ("" by default), each branch its own call.

Output size: diffusers rescales height x width to its default area (1024**2) at the same aspect
ratio, so it only honours an asked size of that area. We generate the size asked for (the same
as diffusers whose default area is height*width); the default is 1024x1024.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.patch_pipeline import PatchImagePipeline
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    current_timesteps,
    decode_images,
    encode_prompts_by_length,
    latent_grid,
    map_groups,
    split_per_state,
)

CLIP_TOKENS = 218  # HiDreamImagePipeline._get_clip_prompt_embeds pads CLIP prompts to at most this


class HiDreamImage(PatchImagePipeline):
    reference_class: ClassVar[str] = "HiDreamImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        cfg_parallel=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True,
        refused={"cache_backend": "its transformer joins another Llama layer's states to each block's input in "
                                  "its own loop, which the caches' block chain does not replay",
                 "ulysses_degree": "its transformer has no sequence-parallel plan",
                 "compile": "its transformer declares no repeated blocks"})
    model_cpu_offload_seq: ClassVar[str] = (
        "text_encoder->text_encoder_2->text_encoder_3->text_encoder_4->transformer->vae")
    # HiDreamImagePipeline.__call__ defaults; height/width (128 latent pixels times the VAE factor)
    # depend on the checkpoint and are filled in `configure`.
    default_params: ClassVar[dict[str, Any]] = {"num_inference_steps": 50, "guidance_scale": 5.0}
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer_3", "tokenizer_4"), default=128, min=1,
                                         help="T5 and Llama prompt tokens (the prompt is padded to this length; "
                                              f"CLIP's to at most {CLIP_TOKENS})."),
    }
    default_sample_size: ClassVar[int] = 128  # HiDreamImagePipeline.default_sample_size, in latent pixels
    guidance: ClassVar[Guidance] = Guidance(
        scale=lambda s: s.cond["guidance_scale"] if s.cond["negative_t5"] is not None else None,
        combine=plain_cfg,
    )

    def configure(self, configs: CheckpointConfigs) -> None:
        super().configure(configs)
        transformer = configs.transformer
        # A non-square image's tokens are padded to this many (the transformer's max_seq).
        self.max_image_tokens = (transformer.get("max_resolution", [128, 128])[0] * transformer.get(
            "max_resolution", [128, 128])[1]) // transformer.get("patch_size", 2) ** 2

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        tokens = (params.height // self.multiple_of) * (params.width // self.multiple_of)
        if params.height != params.width and tokens > self.max_image_tokens:
            raise RequestError("height", f"height x width: a non-square {params.height}x{params.width} image has "
                               f"{tokens} latent patches, over the {self.max_image_tokens} the transformer pads to")

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> list[tuple[torch.Tensor, ...]]:
        """(T5 [S, D], Llama [layers, S, D], pooled CLIP-L + CLIP-G [P]) per prompt
        (HiDreamImagePipeline.encode_prompt)."""
        pooled = torch.cat([self._clip_pooled(tokenizer, encoder, prompts, max_sequence_length) for tokenizer, encoder
                            in ((self.tokenizer, self.text_encoder), (self.tokenizer_2, self.text_encoder_2))], dim=-1)
        t5_ids, t5_mask = self._padded(self.tokenizer_3, prompts, max_sequence_length)
        t5 = self.text_encoder_3(t5_ids, attention_mask=t5_mask)[0]
        llama_ids, llama_mask = self._padded(self.tokenizer_4, prompts, max_sequence_length)
        hidden = self.text_encoder_4(llama_ids, attention_mask=llama_mask, output_hidden_states=True).hidden_states
        llama = torch.stack(hidden[1:], dim=0)  # every layer's output, the embeddings dropped
        return [(t5[i], llama[:, i], pooled[i]) for i in range(len(prompts))]

    def _clip_pooled(self, tokenizer: Any, encoder: Any, prompts: list[str], max_sequence_length: int) -> torch.Tensor:
        """A CLIP encoder's projected pooled output [N, P] (`WithProjection`'s first output)."""
        ids = tokenizer(prompts, padding="max_length", max_length=min(max_sequence_length, CLIP_TOKENS),
                        truncation=True, return_tensors="pt").input_ids
        return encoder(ids.to(self.device), output_hidden_states=True)[0]

    def _padded(self, tokenizer: Any, prompts: list[str], max_sequence_length: int) -> tuple[torch.Tensor, ...]:
        """(input ids, attention mask), each prompt padded to its encoder's length (T5, Llama)."""
        tokens = tokenizer(prompts, padding="max_length", truncation=True, add_special_tokens=True,
                           max_length=min(max_sequence_length, tokenizer.model_max_length), return_tensors="pt")
        return tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Requests with the same max_sequence_length share one call per text encoder.
        embeds = encode_prompts_by_length(requests, uses_cfg=lambda r: r.params.guidance_scale > 1,
                                          encode=self._encode_prompts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: tuple[torch.Tensor, ...],
                       negative: tuple[torch.Tensor, ...] | None) -> DenoiseState:
        from diffusers import UniPCMultistepScheduler
        from diffusers.pipelines.hidream_image.pipeline_hidream_image import calculate_shift, retrieve_timesteps
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        latents = randn_tensor((n, self.transformer.config.in_channels, latent_h, latent_w),
                               generator=self.generator_for(request), device=self.device, dtype=prompt[2].dtype)
        noise_scheduler = self.noise_scheduler_copy()
        if isinstance(noise_scheduler, UniPCMultistepScheduler):  # HiDream-I1-Full: its own flow sigmas
            noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
            timesteps = noise_scheduler.timesteps
        else:  # Dev / Fast: flow matching; the shift is the transformer's longest sequence's
            timesteps, _ = retrieve_timesteps(noise_scheduler, params.num_inference_steps, self.device,
                                              mu=calculate_shift(self.transformer.max_seq))
        noise_scheduler.set_begin_index(0)

        def repeat(embeds: torch.Tensor | None, dim: int = 0) -> torch.Tensor | None:
            return None if embeds is None else torch.stack([embeds] * n, dim=dim)

        negative = negative or (None, None, None)
        cond = {
            "t5": repeat(prompt[0]), "llama": repeat(prompt[1], dim=1), "pooled": repeat(prompt[2]),
            "negative_t5": repeat(negative[0]), "negative_llama": repeat(negative[1], dim=1),
            "negative_pooled": repeat(negative[2]),
            "guidance_scale": params.guidance_scale,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps,
                            cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call per latent size and prompt length.
        self.guided_steps(states, lambda s: (*s.latents.shape[2:], s.cond["t5"].shape[1]), self._predict)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        states = [s for s, _ in rows]
        prefix = "" if rows[0][1] == "cond" else "negative_"
        latents = torch.cat([s.latents for s in states])
        pred = self.transformer(
            hidden_states=latents,
            timesteps=current_timesteps(states),
            encoder_hidden_states_t5=torch.cat([s.cond[f"{prefix}t5"] for s in states]),
            encoder_hidden_states_llama3=torch.cat([s.cond[f"{prefix}llama"] for s in states], dim=1),
            pooled_embeds=torch.cat([s.cond[f"{prefix}pooled"] for s in states]),
            return_dict=False,
        )[0]
        return split_per_state(-pred, states)  # the transformer predicts the negated velocity

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, lambda s: tuple(s.latents.shape[2:]), self._decode_group)  # one VAE call per size

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.latents for s in states])
        return decode_images(self.vae, self.image_processor, latents, states, self.vae_decode)
