"""Wan 2.1 / 2.2 video: a UMT5 text encoder, a 3D DiT and the causal Wan VAE.

Reproduces `diffusers.WanPipeline` (pipelines/wan/pipeline_wan.py) as `WanT2V` and
`diffusers.WanImageToVideoPipeline` (pipeline_wan_i2v.py) as `WanI2V`, split at the encode /
denoise_step / decode seams. The two share everything but the conditioning: I2V adds the
VAE-encoded first frame (plus, on Wan 2.1, CLIP image embeddings) to every transformer call.

Checkpoint-driven variants, read from model_index.json as diffusers does:
- `boundary_ratio` + `transformer_2` (Wan 2.2 A14B): steps with t >= boundary_ratio *
  num_train_timesteps use `transformer` and `guidance_scale`, later ones `transformer_2`
  and `guidance_scale_2` (which defaults to `guidance_scale`).
- `expand_timesteps` (Wan 2.2 TI2V-5B): the timestep is given per latent token, and for I2V
  the first latent frame is pinned to the encoded image instead of channel-concatenated.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    check_one_image,
    check_video_frames,
    encode_prompts_by_length,
    group_by,
    map_groups,
    split_per_state,
)
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations
from omnistage.models.wan.parallel import SEQUENCE_PLAN, TENSOR_PLAN


class _Wan(DiffusionPipelineBase):
    """What Wan T2V and I2V share: checks, prompts, noise, the denoising step and decoding."""

    output_modality: ClassVar[str] = "video"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, sequence_parallel=SEQUENCE_PLAN, tensor_parallel=TENSOR_PLAN,
        fsdp=True, vae_patch_parallel=True, vae_tiling=True, offload=True, quantization=True, lora=True, compile=True)
    # WanPipeline / WanImageToVideoPipeline.__call__ defaults (fps: diffusers' examples export at 16).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 480,
        "width": 832,
        "num_frames": 81,
        "fps": 16,
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer",), default=512, min=1,
                                         help="UMT5 prompt tokens (embeddings are zero-padded to this length)."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        self.transformer = components.get("transformer")
        self.transformer_2 = components.get("transformer_2")
        # Plain CFG, each branch its own call as in diffusers; the scale depends on the expert.
        self.guidance = Guidance(scale=self._guidance_scale, combine=plain_cfg)
        # Either expert may be left out of a Wan 2.2 checkpoint; they share a config shape.
        self.main_transformer = self.transformer if self.transformer is not None else self.transformer_2
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)

    def configure(self, configs: CheckpointConfigs) -> None:
        # boundary_ratio / expand_timesteps live in model_index.json, i.e. the pipeline's config.
        self.boundary_ratio = configs.pipeline.get("boundary_ratio")
        self.expand_timesteps = bool(configs.pipeline.get("expand_timesteps", False))
        self.num_train_timesteps = configs.scheduler.get("num_train_timesteps", 1000)
        self.vae_scale_factor_temporal = configs.vae.scale_factor_temporal
        self.vae_scale_factor_spatial = configs.vae.scale_factor_spatial
        transformer = configs.transformer if configs.has("transformer") else configs.transformer_2
        self.patch_size = tuple(transformer.patch_size)
        # diffusers requires multiples of 16 and then rounds down to whole transformer patches.
        self.height_multiple_of = math.lcm(16, self.vae_scale_factor_spatial * self.patch_size[1])
        self.width_multiple_of = math.lcm(16, self.vae_scale_factor_spatial * self.patch_size[2])

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params  # defaults filled (prepare_request)
        check_divisible(params, height=self.height_multiple_of, width=self.width_multiple_of)
        check_video_frames(params, self.vae_scale_factor_temporal)
        if params.guidance_scale_2 is not None and self.boundary_ratio is None:
            raise RequestError("guidance_scale_2", "guidance_scale_2 needs a two-expert checkpoint (boundary_ratio in model_index.json)")

    # -- 2. encode: prompts, conditioning, initial noise, timesteps -------------------------

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> torch.Tensor:
        return umt5_prompt_embeds(self.tokenizer, self.text_encoder, prompts, max_sequence_length,
                                  self.device, self.main_transformer.dtype)

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        image_embeds = self._encode_images(requests)
        # Requests with the same max_sequence_length share one text-encoder call; each row is
        # [1, max_sequence_length, D]. CFG follows the first expert's scale only, as in diffusers.
        embeds = encode_prompts_by_length(
            requests,
            uses_cfg=lambda r: r.params.guidance_scale > 1,
            encode=lambda texts, max_len: self._encode_prompts(texts, max_len).split(1),
        )
        return [
            self._initial_state(r, {"prompt_embeds": prompt, "negative_prompt_embeds": negative, "image_embeds": image})
            for r, (prompt, negative), image in zip(requests, embeds, image_embeds)
        ]

    def _encode_images(self, requests: list[DiffusionRequest]) -> list[torch.Tensor | None]:
        """Per request, the CLIP image embeddings the transformer cross-attends to (I2V only)."""
        return [None] * len(requests)

    def _initial_state(self, request: DiffusionRequest, cond: dict[str, Any]) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        shape = (1, self.num_channels_latents, self._num_latent_frames(request), params.height // self.vae_scale_factor_spatial,
                 params.width // self.vae_scale_factor_spatial)
        # Wan keeps latents (and the noise scheduler's arithmetic) in float32 whatever the model dtype.
        latents = randn_tensor(shape, generator=self.generator_for(request), device=self.device, dtype=torch.float32)

        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        # Start at index 0 rather than looking the first timestep up (diffusers' T2V does the same).
        noise_scheduler.set_begin_index(0)
        cond.update(self._condition(request, latents))
        cond["guidance_scale"] = params.guidance_scale
        cond["guidance_scale_2"] = (params.guidance_scale_2 if params.guidance_scale_2 is not None
                                    else params.guidance_scale)
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler,
                            timesteps=noise_scheduler.timesteps, cond=cond)

    @property
    def num_channels_latents(self) -> int:
        return self.main_transformer.config.in_channels

    def _num_latent_frames(self, request: DiffusionRequest) -> int:
        return (request.params.num_frames - 1) // self.vae_scale_factor_temporal + 1

    def _condition(self, request: DiffusionRequest, latents: torch.Tensor) -> dict[str, Any]:
        """Extra per-request tensors for the transformer input (I2V: the encoded image)."""
        # expand_timesteps gives every latent token its own timestep; for T2V they are all t.
        return {"timestep_mask": torch.ones(latents.shape[2:], device=self.device)}

    # -- 3. denoise -----------------------------------------------------------------------

    def _expert(self, state: DenoiseState) -> int:
        """Which transformer denoises this step: 0 = `transformer` (Wan 2.1, or Wan 2.2's
        high-noise steps), 1 = `transformer_2` (Wan 2.2's low-noise steps)."""
        if self.boundary_ratio is None:
            return 0
        boundary = self.boundary_ratio * self.num_train_timesteps
        return 0 if state.timesteps[state.step_index] >= boundary else 1

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        return state.latents

    def _timestep(self, state: DenoiseState) -> torch.Tensor:
        """[1] (one timestep per sample), or [1, num_tokens] with expand_timesteps."""
        t = state.timesteps[state.step_index]
        if not self.expand_timesteps:
            return t.expand(1)
        _, ph, pw = self.patch_size
        return (state.cond["timestep_mask"][:, ::ph, ::pw] * t).flatten().unsqueeze(0)

    # Step caches wrap the blocks of each expert (Wan 2.2 has two, each with its own caches).
    # TeaCache publishes Wan 2.1 coefficients per checkpoint (T2V 1.3B / 14B, I2V 480P /
    # 720P), which one family cannot tell apart: no rescaling.
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("blocks",),
        io="single_stream",
        modulated_input=lambda block, args, kwargs: wan_modulated_input(block, args),
        transformers=("transformer", "transformer_2"),
        split_tokens=("video tokens",),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs the same expert, latent shape and prompt length, and the
        # same kind of image conditioning.
        def key(s: DenoiseState) -> tuple:
            image = s.cond["image_embeds"]
            return (self._expert(s), tuple(s.latents.shape[1:]), s.cond["prompt_embeds"].shape[1],
                    None if image is None else tuple(image.shape[1:]), self._call_key(s))

        for group in group_by(states, key):
            self._denoise_group(group, self._expert(group[0]))

    def _call_key(self, state: DenoiseState) -> Any:
        """What else a request must share with others to join their transformer call (VACE: its
        conditioning scale)."""
        return None

    def _guidance_scale(self, state: DenoiseState) -> float | None:
        """CFG when guidance_scale > 1; Wan 2.2's low-noise expert uses guidance_scale_2."""
        if state.cond["negative_prompt_embeds"] is None:
            return None
        return state.cond["guidance_scale" if self._expert(state) == 0 else "guidance_scale_2"]

    def _denoise_group(self, states: list[DenoiseState], expert: int) -> None:
        model = self.transformer if expert == 0 else self.transformer_2
        predict = lambda rows: self._predict(model, rows)  # noqa: E731
        for state, pred in zip(states, self.guided_predictions(states, predict)):
            self.noise_scheduler_step(state, pred)

    def _predict(self, model: Any, rows: Rows) -> list[torch.Tensor]:
        states = [s for s, _ in rows]
        branch = rows[0][1]
        images = [s.cond["image_embeds"] for s in states]
        with model.cache_context(branch):
            noise_pred = model(
                hidden_states=torch.cat([self._model_input(s) for s in states]).to(model.dtype),
                timestep=torch.cat([self._timestep(s) for s in states]),
                encoder_hidden_states=torch.cat([
                    s.cond["prompt_embeds" if branch == "cond" else "negative_prompt_embeds"] for s in states
                ]),
                encoder_hidden_states_image=None if images[0] is None else torch.cat(images),
                return_dict=False,
                **self._control_kwargs(model, states),
            )[0]
        return split_per_state(noise_pred, states)

    def _control_kwargs(self, model: Any, states: list[DenoiseState]) -> dict[str, Any]:
        """Further transformer inputs (VACE: the control latents and their scale)."""
        return {}

    # -- 4. decode ------------------------------------------------------------------------

    def _final_latents(self, state: DenoiseState) -> torch.Tensor:
        return state.latents

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # States with the same video shape share one VAE call.
        return map_groups(states, lambda s: tuple(self._final_latents(s).shape[1:]), self._decode_group)

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([self._final_latents(s) for s in states]).to(self.vae.dtype)
        mean, inv_std = self._latent_stats(self.vae.dtype)
        video = self.vae_decode(latents / inv_std + mean)
        return list(self.video_processor.postprocess_video(video, output_type="np"))  # [F, H, W, 3] each

    def _latent_stats(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return latent_stats(self.vae, self.vae.config.z_dim, self.device, dtype)


class WanT2V(_Wan):
    reference_class: ClassVar[str] = "WanPipeline"
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->transformer_2->vae"
    _optional_components: ClassVar[list[str]] = ["transformer", "transformer_2"]


class WanI2V(_Wan):
    reference_class: ClassVar[str] = "WanImageToVideoPipeline"
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->image_encoder->transformer->transformer_2->vae"
    # Wan 2.2 I2V has no CLIP image encoder: its transformer has no image_dim.
    _optional_components: ClassVar[list[str]] = ["transformer", "transformer_2", "image_encoder", "image_processor"]
    needs_image: ClassVar[bool] = True

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        super().__init__(components, device, dtype, configs)
        self.image_encoder = components.get("image_encoder")
        self.image_processor = components.get("image_processor")

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_one_image(request)

    @property
    def num_channels_latents(self) -> int:
        # The transformer's input is the noise plus the condition; the noise has the VAE's channels.
        return self.vae.config.z_dim

    def _encode_images(self, requests: list[DiffusionRequest]) -> list[torch.Tensor | None]:
        # Only Wan 2.1's I2V transformer cross-attends to CLIP image features (image_dim set).
        if self.transformer is None or self.transformer.config.image_dim is None:
            return [None] * len(requests)
        pixels = self.image_processor(images=[r.images[0] for r in requests], return_tensors="pt").to(self.device)
        hidden = self.image_encoder(**pixels, output_hidden_states=True).hidden_states[-2]
        return [h.unsqueeze(0).to(self.main_transformer.dtype) for h in hidden]

    def _condition(self, request: DiffusionRequest, latents: torch.Tensor) -> dict[str, Any]:
        """The first frame through the VAE (WanImageToVideoPipeline.prepare_latents).

        Wan 2.1 / 2.2 A14B: the video [image, zeros...] is encoded and concatenated to the noise
        on the channel axis, behind a mask that marks the frames the image fixes. With
        expand_timesteps only the image is encoded; it replaces the first latent frame, whose
        tokens then get timestep 0."""
        from diffusers.pipelines.wan.pipeline_wan_i2v import retrieve_latents

        params = request.params
        height, width, num_frames = params.height, params.width, params.num_frames
        _, _, num_latent_frames, latent_h, latent_w = latents.shape
        image = self.video_processor.preprocess(request.images[0], height=height, width=width)
        image = image.to(self.device, dtype=torch.float32).unsqueeze(2)  # [1, 3, 1, H, W]
        if self.expand_timesteps:
            video = image
        else:
            video = torch.cat([image, image.new_zeros(1, 3, num_frames - 1, height, width)], dim=2)
        mean, inv_std = self._latent_stats(torch.float32)
        encoded = retrieve_latents(self.vae_encode(video.to(self.vae.dtype)), sample_mode="argmax")
        encoded = (encoded.to(torch.float32) - mean) * inv_std

        if self.expand_timesteps:
            first_frame_mask = torch.ones(1, 1, num_latent_frames, latent_h, latent_w, device=self.device)
            first_frame_mask[:, :, 0] = 0
            return {"condition": encoded, "first_frame_mask": first_frame_mask, "timestep_mask": first_frame_mask[0, 0]}

        # One mask channel per frame the VAE folds into a latent frame: the first latent frame
        # stands for the image repeated scale_factor_temporal times.
        temporal = self.vae_scale_factor_temporal
        mask = torch.ones(1, 1, num_frames, latent_h, latent_w)
        mask[:, :, 1:] = 0
        mask = torch.cat([mask[:, :, :1].repeat_interleave(temporal, dim=2), mask[:, :, 1:]], dim=2)
        mask = mask.view(1, -1, temporal, latent_h, latent_w).transpose(1, 2).to(self.device)
        return {"condition": torch.cat([mask, encoded], dim=1)}

    def _model_input(self, state: DenoiseState) -> torch.Tensor:
        if self.expand_timesteps:
            return self._final_latents(state)
        return torch.cat([state.latents, state.cond["condition"]], dim=1)

    def _final_latents(self, state: DenoiseState) -> torch.Tensor:
        if not self.expand_timesteps:
            return state.latents
        mask = state.cond["first_frame_mask"]
        return (1 - mask) * state.cond["condition"] + mask * state.latents



def umt5_prompt_embeds(tokenizer: Any, text_encoder: Any, prompts: list[str], max_sequence_length: int,
                       device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """UMT5 embeddings [N, max_sequence_length, D] with the padding positions zeroed
    (WanPipeline._get_t5_prompt_embeds; Helios encodes prompts the same way). The attention mask
    keeps rows independent."""
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    tokens = tokenizer([prompt_clean(p) for p in prompts], padding="max_length", max_length=max_sequence_length,
                       truncation=True, add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
    mask = tokens.attention_mask.to(device)
    embeds = text_encoder(tokens.input_ids.to(device), mask).last_hidden_state
    # Keep each prompt's first seq_len positions and zero the rest, as diffusers does.
    seq_lens = mask.gt(0).sum(dim=1)
    keep = torch.arange(max_sequence_length, device=device)[None, :] < seq_lens[:, None]
    return (embeds * keep.unsqueeze(-1)).to(dtype)

def latent_stats(vae: Any, num_channels: int, device: torch.device,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, 1 / std) of a video VAE's latents, shaped to broadcast over [B, C, T, H, W]: the Wan
    VAE's config lists them, LTX-2's VAE holds them as buffers, others are unnormalized (as the
    pipelines that take either, e.g. SANA-Video, read them)."""
    if "latents_mean" in vae.config:
        mean, std = torch.tensor(vae.config.latents_mean), torch.tensor(vae.config.latents_std)
    elif hasattr(vae, "latents_mean"):
        mean, std = vae.latents_mean, vae.latents_std
    else:
        mean, std = torch.zeros(num_channels), torch.ones(num_channels)
    shape = (1, num_channels, 1, 1, 1)
    return mean.view(shape).to(device, dtype), 1.0 / std.view(shape).to(device, dtype)


def wan_modulated_input(block: Any, args: tuple) -> torch.Tensor:
    """TeaCache's input: the first block's normed tokens, shifted and scaled by its timestep
    modulation (WanTransformerBlock's self-attention input; temb is [B, 6, D], or
    [B, tokens, 6, D] with per-token timesteps)."""
    hidden, temb = args[0], args[2]
    if temb.ndim == 4:
        shift, scale = (block.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)[:2]
        shift, scale = shift.squeeze(2), scale.squeeze(2)
    else:
        shift, scale = (block.scale_shift_table + temb.float()).chunk(6, dim=1)[:2]
    return block.norm1(hidden.float()) * (1 + scale) + shift
