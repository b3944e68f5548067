"""LongCat-Image: a Qwen2.5-VL text encoder read at its last layer over a fixed 512-token prompt
block, a FLUX-style MMDiT over packed 2x2 latent patches, CFG with a norm-capping renorm.

Reproduces `diffusers.LongCatImagePipeline` (pipelines/longcat_image/pipeline_longcat_image.py),
split at the encode / denoise_step / decode seams. Quoted text in a prompt ('...' or "...") is
tokenized character by character, as diffusers does for rendering text. CFG runs when
`guidance_scale > 1`, on the negative prompt ("" by default), each branch its own call; with
`enable_cfg_renorm` (the default) the guided prediction's per-token norm is capped at the cond
prediction's, scaled no lower than `cfg_renorm_min`.
Not run: the prompt rewrite (diffusers' `enable_prompt_rewrite`, on by default there: the VLM
rewrites the prompt by generating); the field is accepted only as false, and the checkpoint's
`text_processor`, which only the rewrite uses, is not loaded.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.guidance import Guidance, plain_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.patch_pipeline import FluxStylePipeline
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    encode_prompt_pairs,
    latent_grid,
    pack_latents,
    repeat_per_output,
    set_flow_match_timesteps,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations

# LongCatImagePipeline.__init__'s prompt block: the chat template around a prompt padded to
# TEXT_TOKENS (its `tokenizer_max_length`), the length every prompt embedding has.
PROMPT_PREFIX = ("<|im_start|>system\nAs an image captioning expert, generate a descriptive text prompt based on an "
                 "image content, suitable for input to a text-to-image model.<|im_end|>\n<|im_start|>user\n")
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
TEXT_TOKENS = 512


def renormed_cfg(state: DenoiseState, cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain CFG; with `enable_cfg_renorm`, each token's guided prediction scaled down to at most
    the cond prediction's norm (the factor clamped to [cfg_renorm_min, 1]), as diffusers does."""
    guided = plain_cfg(state, cond, uncond, scale)
    if not state.cond["enable_cfg_renorm"]:
        return guided
    cond_norm = torch.norm(cond, dim=-1, keepdim=True)
    guided_norm = torch.norm(guided, dim=-1, keepdim=True)
    return guided * (cond_norm / (guided_norm + 1e-8)).clamp(min=state.cond["cfg_renorm_min"], max=1.0)


class LongCatImage(FluxStylePipeline):
    reference_class: ClassVar[str] = "LongCatImagePipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, fsdp=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, compile=True)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    # Only the prompt rewrite uses it (a Qwen2VLProcessor, which transformers 5.24 cannot build
    # without torchvision): never loaded.
    _optional_components: ClassVar[list[str]] = ["text_processor"]
    loader_overrides: ClassVar[dict[str, Any]] = {"text_processor": None}
    # LongCatImagePipeline.__call__ defaults; height/width (128 latent pixels times the VAE
    # factor) depend on the checkpoint and are filled in `configure`.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 50,
        "guidance_scale": 4.5,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "enable_cfg_renorm": ExtraSpec(bool, default=True, help="Cap each token's guided prediction at the cond "
                                                                "prediction's norm."),
        "cfg_renorm_min": ExtraSpec(float, default=0.0, min=0.0, max=1.0,
                                    help="The smallest factor the renorm scales by (1 turns it off)."),
        "enable_prompt_rewrite": ExtraSpec(bool, default=False, choices=(False,),
                                           help="diffusers' VLM prompt rewrite; not run here, so only false."),
    }
    default_sample_size: ClassVar[int] = 128  # LongCatImagePipeline.default_sample_size, in latent pixels

    # -- 1. check inputs: sizes divide by multiple_of (PatchImagePipeline) ------------------

    # -- 2. encode: prompts, initial noise, timesteps ---------------------------------------

    def _prompt_tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids (LongCatImagePipeline._encode_prompt): quoted parts one
        character at a time, the rest as usual; cut to TEXT_TOKENS."""
        from diffusers.pipelines.longcat_image.pipeline_longcat_image import split_quotation

        tokens: list[int] = []
        for part, quoted in split_quotation(prompt):
            for piece in (part if quoted else [part]):
                tokens.extend(self.tokenizer(piece, add_special_tokens=False)["input_ids"])
        return tokens[:TEXT_TOKENS]

    def _encode_prompts(self, prompts: list[str]) -> torch.Tensor:
        """[N, TEXT_TOKENS, D]: each prompt padded to TEXT_TOKENS inside the chat template, the
        encoder's last hidden state with the template's tokens dropped. Padding is masked, so a
        prompt's embedding is the same in a batch as alone."""
        input_ids, mask = self._prompt_block(prompts, PROMPT_PREFIX)
        out = self.text_encoder(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                output_hidden_states=True)
        return out.hidden_states[-1][:, -TEXT_TOKENS - self._suffix_length: -self._suffix_length]

    @property
    def _suffix_length(self) -> int:
        return len(self.tokenizer(PROMPT_SUFFIX, add_special_tokens=False)["input_ids"])

    def _prompt_block(self, prompts: list[str], prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, attention mask) [N, L]: `prefix`, each prompt padded to TEXT_TOKENS (the
        padding masked), PROMPT_SUFFIX."""
        padded = self.tokenizer.pad({"input_ids": [self._prompt_tokens(p) for p in prompts]}, max_length=TEXT_TOKENS,
                                    padding="max_length", return_attention_mask=True, return_tensors="pt")
        prefix_ids = torch.tensor(self.tokenizer(prefix, add_special_tokens=False)["input_ids"])
        suffix_ids = torch.tensor(self.tokenizer(PROMPT_SUFFIX, add_special_tokens=False)["input_ids"])
        n = len(prompts)
        input_ids = torch.cat([prefix_ids.expand(n, -1), padded.input_ids, suffix_ids.expand(n, -1)], dim=-1)
        mask = torch.cat([torch.ones(n, len(prefix_ids), dtype=padded.attention_mask.dtype), padded.attention_mask,
                          torch.ones(n, len(suffix_ids), dtype=padded.attention_mask.dtype)], dim=-1)
        return input_ids, mask

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # One text-encoder call over every prompt, then the negative prompts ("" unless given) of
        # the requests that run CFG (guidance_scale > 1).
        embeds = encode_prompt_pairs(requests, uses_cfg=lambda r: r.params.guidance_scale > 1,
                                     encode=self._encode_prompts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: torch.Tensor,
                       negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        # Drawn in the generator's default dtype, then cast, as diffusers does (not packed_noise).
        noise = randn_tensor((n, self.transformer.config.in_channels // 4, latent_h, latent_w),
                             generator=self.generator_for(request), device=self.device)
        latents = pack_latents(noise.to(prompt.dtype))
        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        timesteps = set_flow_match_timesteps(noise_scheduler, np.linspace(1.0, 1.0 / num_steps, num_steps),
                                             latents.shape[1], self.device)

        cond = {
            "prompt_embeds": repeat_per_output(prompt, n),
            "negative_prompt_embeds": repeat_per_output(negative, n),
            # Text on plane 0 at (i, i); the image on plane 1, its grid offset past the text (the
            # edit pipeline's prompt embeddings also hold the input image's vision tokens).
            "text_ids": prepare_pos_ids(modality_id=0, type="text", start=(0, 0),
                                        num_token=prompt.shape[0]).to(self.device),
            "latent_image_ids": self._image_ids(1, prompt.shape[0], latent_h, latent_w),
            **self._guidance_cond(params),
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=timesteps,
                            cond=cond)

    def _image_ids(self, plane: int, num_text_tokens: int, latent_h: int, latent_w: int) -> torch.Tensor:
        """Position ids of a packed latent grid on `plane`, offset past the text."""
        from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

        return prepare_pos_ids(modality_id=plane, type="image", start=(num_text_tokens, num_text_tokens),
                               height=latent_h // 2, width=latent_w // 2).to(self.device)

    def _guidance_cond(self, params: Any) -> dict[str, Any]:
        """What `guidance` reads from a state's cond."""
        return {"guidance_scale": params.guidance_scale, "enable_cfg_renorm": params.extras["enable_cfg_renorm"],
                "cfg_renorm_min": params.extras["cfg_renorm_min"]}

    # -- 3. denoise: FluxStylePipeline's (no TeaCache coefficients are published: no rescaling)

    # CFG when guidance_scale > 1, with the renorm; each branch its own call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative(), combine=renormed_cfg)

    # -- 4. decode: FluxStylePipeline's ---------------------------------------------------
