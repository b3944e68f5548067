"""LTX-2 text/image -> video with its soundtrack: one audio-video DiT denoises both at once.

Reproduces `diffusers.LTX2Pipeline` (pipelines/ltx2/pipeline_ltx2.py) as `LTX2T2V`,
`LTX2ImageToVideoPipeline` (pipeline_ltx2_image2video.py) as `LTX2I2V` and `LTX2ConditionPipeline`
(pipeline_ltx2_condition.py) as `LTX2Condition`, split at the encode / denoise_step / decode seams
(the image and condition variants differ only in the initial latents and a per-token mask, see
their classes). `LTX2T2V` also takes a first stage's latents (`condition["latents"]`, and
`condition["audio_latents"]`), noised by `noise_scale`, as diffusers' `latents=` / `audio_latents=`:
the refining stage of the two-stage pipeline (`__init__.py`), and hands its own latents on when
asked (`condition["output"] == "latents"`, diffusers' `output_type="latent"`). The `schedule`
extra picks the distilled checkpoints' fixed sigmas (diffusers' DISTILLED_SIGMA_VALUES and
STAGE_2_DISTILLED_SIGMA_VALUES) instead of the shifted default:

- encode: Gemma 3's stacked hidden states (left-padded prompts) go through the text
  connectors into a video and an audio context; each request draws its video noise, then
  its audio noise, from its own generator, and gets its own video and audio noise schedulers
  (flow matching, shifted by the video's token count).
- denoise_step: the transformer predicts a velocity for the video tokens and for the audio
  tokens together. LTX-2's guidance is several terms added in x0 space, per modality:
  CFG against the negative prompt (the cond and uncond rows in one call, as diffusers
  batches them), spatio-temporal guidance (STG: a pass with self-attention skipped in one
  block), modality isolation (a pass with audio<->video cross-attention off), then a
  rescale towards the cond prediction's std. Each pass is one batched call over every
  request that runs it this step.
- decode: the video VAE decodes the video latents; the audio VAE decodes the audio
  latents to a mel spectrogram and the vocoder turns it into a stereo waveform, carried on
  the VideoPayload so the MP4 gets an audio track.

The shared guidance seam (guidance.py: one cond/uncond pair and a combine rule) cannot
express three extra passes and two modalities, so the family runs its own guidance here;
CFG-parallel and the step caches, which hook that seam, refuse it by name.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.params import DiffusionParams, ExtraSpec, fill_defaults
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
)
from omnistage.core.errors import RequestError
from omnistage.core.types import LatentPayload, VideoPayload
from omnistage.diffusion.accel.declaration import Accelerations

# diffusers' default STG block (LTX-2.3's recommendation; LTX-2.0's is 29). As in diffusers, a
# default past the transformer's last block perturbs nothing.
DEFAULT_STG_BLOCK = 28

SCHEDULES = ("default", "distilled", "distilled_stage_2")
"""`schedule` extra: the checkpoint's shifted flow schedule over `num_inference_steps`, or the fixed
sigmas of LTX-2's distilled checkpoints (the whole 8 steps, or the 3 a two-stage pipeline's second
stage runs), used as they are (no resolution shift), as the LTX-2 authors' pipelines do."""


def fixed_sigmas(schedule: str) -> list[float] | None:
    """The sigmas of a fixed `schedule` (diffusers' own constants), None for the default one."""
    from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES, STAGE_2_DISTILLED_SIGMA_VALUES

    return {"distilled": DISTILLED_SIGMA_VALUES, "distilled_stage_2": STAGE_2_DISTILLED_SIGMA_VALUES}.get(schedule)


# The passes of one step: which prompt each row uses and how the transformer runs it.
Pass = str  # "uncond" | "cond" | "stg" | "modality"


def vae_ratios(vae: dict[str, Any]) -> tuple[int, int]:
    """(spatial, temporal) compression of an LTX-2 video VAE from its config: 2x per scaling
    block after its pixel patch (the ratios are properties, not config keys, in diffusers)."""
    scaling = sum(vae.get("spatio_temporal_scaling", ()))
    spatial = vae.get("spatial_compression_ratio") or vae.get("patch_size", 1) * 2 ** scaling
    return spatial, vae.get("temporal_compression_ratio") or vae.get("patch_size_t", 1) * 2 ** scaling


class LTX2T2V(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "LTX2Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        vae_tiling=True, offload=True, quantization=True, lora=True, compile=True,
        refused={"cfg_parallel_size": "it runs its own multi-pass guidance (CFG, STG, modality)",
                 "cache_backend": "its audio-video blocks have no cache hook"})
    output_modality: ClassVar[str] = "video"
    takes_latents: ClassVar[bool] = True
    """Whether a request may bring a first stage's latents (condition.latents) to refine."""
    noises_conditions: ClassVar[bool] = False
    """Whether `noise_scale` also sets the noise level its conditions start from (without input latents)."""
    unscheduled_noise_scale: ClassVar[float] = 0.0
    """`noise_scale`'s default without a fixed schedule: LTX2Pipeline's (input latents kept as they are)."""
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->connectors->transformer->vae->audio_vae->vocoder"
    # Prompt enhancement (a Gemma generate call) and LTX-2.5's duration head are not served.
    _optional_components: ClassVar[list[str]] = ["processor", "prompt_enhancer", "duration_head"]
    # LTX2Pipeline.__call__ defaults (fps is its frame_rate).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 512,
        "width": 768,
        "num_frames": 121,
        "fps": 24.0,
        "num_inference_steps": 30,
        "guidance_scale": 3.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, default=1024, min=1,
                                         max_from=("tokenizer", "text_encoder"),
                                         help="Gemma prompt tokens (left-padded to this)."),
        "guidance_rescale": ExtraSpec(float, default=0.7, min=0, max=1,
                                      help="Rescale of the guided video x0 towards the cond prediction's std."),
        "stg_scale": ExtraSpec(float, default=1.0, min=0, help="Video spatio-temporal guidance; 0 = off."),
        "modality_scale": ExtraSpec(float, default=3.0, min=0,
                                    help="Video modality-isolation guidance; <= 1 = off."),
        "audio_guidance_scale": ExtraSpec(float, default=7.0, min=0, help="CFG scale of the audio (0 = the video's)."),
        "audio_guidance_rescale": ExtraSpec(float, default=0.7, min=0, max=1, help="guidance_rescale of the audio."),
        "audio_stg_scale": ExtraSpec(float, default=1.0, min=0, help="STG scale of the audio (0 = the video's)."),
        "audio_modality_scale": ExtraSpec(float, default=3.0, min=0,
                                          help="Modality-isolation scale of the audio (0 = the video's)."),
        "stg_block": ExtraSpec(int, min=0, help=f"Transformer block STG perturbs (default {DEFAULT_STG_BLOCK})."),
        "motion_speed": ExtraSpec(float, default=1.0, min=1e-3,
                                  help="Motion relative to real time: positions use fps / motion_speed."),
        "use_cross_timestep": ExtraSpec(bool, default=True,
                                        help="Cross-modal attention modulated by the other modality's sigma "
                                             "(LTX-2.3); false = LTX-2.0."),
        "decode_timestep": ExtraSpec(float, default=0.0, min=0, max=1,
                                     help="Timestep of a timestep-conditioned VAE decode."),
        "decode_noise_scale": ExtraSpec(float, min=0, max=1, help="Noise mixed in before such a decode "
                                                                  "(default: decode_timestep)."),
        "schedule": ExtraSpec(str, default="default", choices=SCHEDULES,
                              help="Sigmas: the checkpoint's shifted schedule over num_inference_steps, or a "
                                   "distilled checkpoint's fixed 8 (distilled) or 3 (distilled_stage_2), whose "
                                   "length is the step count."),
        "noise_scale": ExtraSpec(float, min=0, max=1, help="Noise mixed into input latents (condition.latents, "
                                                           "a second stage) before denoising (default: a fixed "
                                                           "schedule's first sigma, else 0)."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_spatial_ratio)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_spatial_ratio, self.vae_temporal_ratio = vae_ratios(configs.vae)
        self.patch_size = configs.transformer.get("patch_size", 1)
        self.patch_size_t = configs.transformer.get("patch_size_t", 1)
        self.num_blocks = configs.transformer.get("num_layers", 0)
        self.latent_channels = configs.transformer.get("in_channels")
        # diffusers requires multiples of 32; the latent grid must also be whole.
        self.size_multiple_of = math.lcm(32, self.vae_spatial_ratio * self.patch_size)
        audio = configs.audio_vae
        self.audio_latent_ratio = 4  # AutoencoderKLLTX2Audio's fixed mel / time downsampling
        self.audio_latents_per_second = (audio.get("sample_rate", 16000) / audio.get("mel_hop_length", 160)
                                         / self.audio_latent_ratio)

    # -- 1. check inputs ----------------------------------------------------------------

    def prepare_params(self, params: DiffusionParams) -> DiffusionParams:
        # A fixed schedule's length is the step count, unless the request (or deploy) gives one.
        given = fill_defaults(params, self.deploy_defaults)
        schedule = given.extras.get("schedule")
        sigmas = fixed_sigmas(schedule) if isinstance(schedule, str) else None
        if sigmas is not None and given.num_inference_steps is None:
            params = params.model_copy(update={"num_inference_steps": len(sigmas)})
        return super().prepare_params(params)

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        # Input latents give the size and length (diffusers reads them from the latents too).
        latents = request.condition.get("latents")
        if isinstance(latents, torch.Tensor) and latents.ndim == 5:
            frames, h, w = latents.shape[2:]
            fields = {"height": h * self.vae_spatial_ratio, "width": w * self.vae_spatial_ratio,
                      "num_frames": (frames - 1) * self.vae_temporal_ratio + 1}
            request = dataclasses.replace(request, params=request.params.model_copy(update=fields))
        return super().prepare_request(request)

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params  # defaults filled (prepare_request)
        sigmas = fixed_sigmas(params.extras["schedule"])
        if sigmas is not None and params.num_inference_steps != len(sigmas):
            raise RequestError("num_inference_steps", f"num_inference_steps: the {params.extras['schedule']} "
                               f"schedule has {len(sigmas)} steps, got {params.num_inference_steps}")
        self._check_latents(request)
        check_divisible(params, height=self.size_multiple_of, width=self.size_multiple_of)
        check_video_frames(params, self.vae_temporal_ratio)
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: LTX-2 does not take it (its guidance knobs are extras)")
        block = params.extras.get("stg_block")
        if block is not None and block >= self.num_blocks:
            raise RequestError("stg_block", f"extras.stg_block must be < {self.num_blocks} (the transformer's blocks), "
                               f"got {block}")

    def _check_latents(self, request: DiffusionRequest) -> None:
        """Input latents (a first stage's, un-normalised as diffusers' latent output): video
        [1, C, F, H, W], optionally audio [1, C, L, M]; `noise_scale` only with them."""
        video, audio = request.condition.get("latents"), request.condition.get("audio_latents")
        if video is not None and not self.takes_latents:
            raise RequestError("condition", f"condition.latents: {self.reference_class} does not take input latents")
        if video is None:
            if audio is not None:
                raise RequestError("condition", "condition.audio_latents: only with condition.latents")
            if request.params.extras.get("noise_scale") is not None and not self.noises_conditions:
                raise RequestError("noise_scale", "extras.noise_scale: only with input latents (condition.latents)")
            return
        for name, value, ndim, channels in (("latents", video, 5, self.latent_channels),
                                            ("audio_latents", audio, 4, None)):
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.ndim != ndim or value.shape[0] != 1 or \
                    (channels is not None and value.shape[1] != channels):
                shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
                raise RequestError("condition", f"condition.{name}: expected a [1, {channels or 'C'}, ...] tensor of "
                                                f"{ndim} dims, got {shape}")

    # -- 2. encode: prompts, noise, noise schedulers, positions ---------------------------

    def _encode_prompts(self, prompts: list[str], max_sequence_length: int) -> list[dict[str, torch.Tensor]]:
        """Per prompt, the connectors' video and audio contexts [1, L, D] and mask [1, L]
        (LTX2Pipeline._get_gemma_prompt_embeds, then its connectors call)."""
        tokens = self.tokenizer([p.strip() for p in prompts], padding="max_length", max_length=max_sequence_length,
                                truncation=True, add_special_tokens=True, return_tensors="pt", padding_side="left")
        input_ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        hidden = self.text_encoder(input_ids=input_ids, attention_mask=mask, output_hidden_states=True).hidden_states
        embeds = torch.stack(hidden, dim=-1).flatten(2, 3).to(self.text_encoder.dtype)
        video, audio, connector_mask = self.connectors(embeds, mask, padding_side="left")
        return [{"video": v, "audio": a, "mask": m}
                for v, a, m in zip(video.split(1), audio.split(1), connector_mask.split(1))]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Requests with the same max_sequence_length share one Gemma + connectors call.
        embeds = encode_prompts_by_length(requests, uses_cfg=lambda r: self._scales(r)["cfg"],
                                          encode=self._encode_prompts)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    @staticmethod
    def _scales(request: DiffusionRequest) -> dict[str, Any]:
        """The request's guidance terms as diffusers resolves them (an audio value of 0 takes
        the video's), and which passes run."""
        x, g = request.params.extras, request.params.guidance_scale
        scales = {
            "video_cfg": g, "audio_cfg": x["audio_guidance_scale"] or g,
            "video_stg": x["stg_scale"], "audio_stg": x["audio_stg_scale"] or x["stg_scale"],
            "video_modality": x["modality_scale"], "audio_modality": x["audio_modality_scale"] or x["modality_scale"],
            "video_rescale": x["guidance_rescale"],
            "audio_rescale": x["audio_guidance_rescale"] or x["guidance_rescale"],
        }
        scales["cfg"] = scales["video_cfg"] > 1 or scales["audio_cfg"] > 1
        scales["stg"] = scales["video_stg"] > 0 or scales["audio_stg"] > 0
        scales["modality"] = scales["video_modality"] > 1 or scales["audio_modality"] > 1
        return scales

    def _initial_state(self, request: DiffusionRequest, prompt: dict, negative: dict | None) -> DenoiseState:
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift, retrieve_timesteps
        from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

        params, extras = request.params, request.params.extras
        generator = self.generator_for(request)
        num_latent_frames = (params.num_frames - 1) // self.vae_temporal_ratio + 1
        latent_h, latent_w = params.height // self.vae_spatial_ratio, params.width // self.vae_spatial_ratio
        # 1. Video noise (and conditions), then audio noise, from the request's generator (diffusers' order).
        fps = conditioning_frame_rate(params.fps, extras["motion_speed"])
        steps = params.num_inference_steps
        fixed = fixed_sigmas(extras["schedule"])
        sigmas = np.linspace(1.0, 1 / steps, steps) if fixed is None else fixed
        video_cond = self._video_latents(request, generator, (num_latent_frames, latent_h, latent_w), fps)
        latents = video_cond.pop("latents")
        mel_bins = self.audio_vae.config.mel_bins // self.audio_latent_ratio
        audio_latents = self._audio_latents(request, generator, mel_bins)
        audio_frames = audio_latents.shape[1]

        # 2. Flow-matching sigmas shifted by the video token count (a fixed schedule's as they are:
        # diffusers' recipe swaps in a scheduler without the shifts); audio has its own copy.
        config = self.noise_scheduler.config
        mu = calculate_shift(latents.shape[1], config.get("base_image_seq_len", 1024),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.95),
                             config.get("max_shift", 2.05))
        noise_schedulers = []
        # A checkpoint's own audio scheduler (LTX2ConditionPipeline's optional one), else the video's.
        audio_source = getattr(self, "audio_scheduler", None) or self.noise_scheduler
        for source in (self.noise_scheduler, audio_source):
            noise_scheduler = copy.deepcopy(source) if fixed is None else type(source).from_config(
                source.config, use_dynamic_shifting=False, shift_terminal=None)
            timesteps, _ = retrieve_timesteps(noise_scheduler, steps, self.device, sigmas=sigmas, mu=mu)
            noise_scheduler.set_begin_index(0)
            noise_schedulers.append(noise_scheduler)

        # 3. RoPE positions, fixed for the whole run (keyframe conditions' tokens after the video's).
        video_coords = self.transformer.rope.prepare_video_coords(1, num_latent_frames, latent_h, latent_w,
                                                                  self.device, fps=fps)
        if "keyframe_coords" in video_cond:
            video_coords = torch.cat([video_coords, video_cond.pop("keyframe_coords")], dim=2)
        audio_coords = self.transformer.audio_rope.prepare_audio_coords(1, audio_frames, self.device)
        cond = {
            "prompt": prompt, "negative": negative, "scales": self._scales(request),
            "audio_latents": audio_latents, "audio_noise_scheduler": noise_schedulers[1],
            "video_coords": video_coords, "audio_coords": audio_coords,
            "video_shape": (num_latent_frames, latent_h, latent_w), "audio_shape": (audio_frames, mel_bins),
            "stg_block": DEFAULT_STG_BLOCK if extras.get("stg_block") is None else extras["stg_block"],
            "use_cross_timestep": extras["use_cross_timestep"],
            "generator": generator,  # a timestep-conditioned VAE draws its decode noise from it
            **video_cond,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_schedulers[0],
                            timesteps=timesteps, cond=cond)

    def _audio_latents(self, request: DiffusionRequest, generator: torch.Generator, mel_bins: int) -> torch.Tensor:
        """The packed initial audio latents [1, L, C * M]: the input ones (normalised, noised by
        `noise_scale`, LTX2Pipeline.prepare_audio_latents), else noise as long as the video."""
        given = request.condition.get("audio_latents")
        if given is None:
            params = request.params
            return self._audio_noise(generator, round(params.num_frames / params.fps * self.audio_latents_per_second),
                                     mel_bins)
        packed = given.to(self.device, torch.float32).transpose(1, 2).flatten(2, 3)
        mean = self.audio_vae.latents_mean.to(packed.device, packed.dtype)
        std = self.audio_vae.latents_std.to(packed.device, packed.dtype)
        return _noised((packed - mean) / std, self._noise_scale(request), generator)

    def _audio_noise(self, generator: torch.Generator, frames: int, mel_bins: int) -> torch.Tensor:
        """The packed initial audio latents [1, L, C * M]: drawn as [1, C, L, M], then packed."""
        from diffusers.utils.torch_utils import randn_tensor

        audio = randn_tensor((1, self.audio_vae.config.latent_channels, frames, mel_bins), generator=generator,
                             device=self.device, dtype=torch.float32)
        return audio.transpose(1, 2).flatten(2, 3)

    def _video_latents(self, request: DiffusionRequest, generator: torch.Generator, shape: tuple[int, int, int],
                       fps: float) -> dict[str, torch.Tensor]:
        """The packed initial video latents [1, tokens, C] (`latents`), and what conditions them
        (image-to-video, conditions): here plain noise over the latent grid `shape` (F, H, W)."""
        from diffusers.utils.torch_utils import randn_tensor

        given = request.condition.get("latents")
        if given is not None:  # LTX2Pipeline.prepare_latents with latents: normalised, packed, noised
            latents = self._pack_video(self._normalize(given.to(self.device, torch.float32)))
            return {"latents": _noised(latents, self._noise_scale(request), generator)}
        noise = randn_tensor((1, self.transformer.config.in_channels, *shape), generator=generator,
                             device=self.device, dtype=torch.float32)
        return {"latents": self._pack_video(noise)}

    def _noise_scale(self, request: DiffusionRequest) -> float:
        """How much noise input latents (conditions) get: `noise_scale`, else a fixed schedule's first
        sigma (what diffusers' two-stage recipe passes), else `unscheduled_noise_scale`."""
        given, fixed = request.params.extras.get("noise_scale"), fixed_sigmas(request.params.extras["schedule"])
        return given if given is not None else fixed[0] if fixed else self.unscheduled_noise_scale

    def generator_for(self, request: DiffusionRequest) -> torch.Generator:
        # A second stage draws on from where the first stage's generator stopped, as diffusers'
        # recipe passes one generator to both calls.
        state = request.condition.get("generator_state")
        if state is None:
            return super().generator_for(request)
        generator = torch.Generator("cpu")
        generator.set_state(state)
        return generator

    def _normalize(self, latents: torch.Tensor) -> torch.Tensor:
        """Un-normalised [B, C, F, H, W] video latents -> the transformer's."""
        mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        return (latents - mean) * self.vae.config.scaling_factor / std

    def _denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        return latents * std / self.vae.config.scaling_factor + mean

    def _video_timestep(self, state: DenoiseState) -> torch.Tensor:
        """[1]: one timestep per sample (image-to-video: one per video token)."""
        return state.timesteps[state.step_index].expand(1)

    def _step_video(self, state: DenoiseState, velocity: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """The video latents after the noise scheduler's step (image-to-video keeps its image)."""
        return state.noise_scheduler.step(velocity, t, state.latents, return_dict=False)[0]

    def _pack_video(self, latents: torch.Tensor) -> torch.Tensor:
        return _pack_latents(latents, self.patch_size, self.patch_size_t)

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One call needs equal video and audio token grids, prompt length and cross-timestep mode.
        def key(s: DenoiseState) -> tuple:
            return (s.cond["video_shape"], s.latents.shape[1], s.cond["audio_shape"],
                    s.cond["prompt"]["video"].shape[1], s.cond["use_cross_timestep"])

        for group in group_by(states, key):
            self._denoise_group(group)

    def _denoise_group(self, states: list[DenoiseState]) -> None:
        """One step of LTX2Pipeline's loop for `states`: the passes each needs, batched over
        the states, then the x0-space guidance and both noise schedulers' steps."""
        guided = [s for s in states if s.cond["scales"]["cfg"]]
        preds = self._run_pass([(s, "uncond") for s in guided] + [(s, "cond") for s in states])
        uncond = dict(zip(map(id, guided), preds[: len(guided)]))
        cond = dict(zip(map(id, states), preds[len(guided):]))
        extra: dict[Pass, dict[int, tuple]] = {}
        for kind in ("stg", "modality"):
            users = [s for s in states if s.cond["scales"][kind]]
            extra[kind] = {}
            # STG perturbs one block per call: requests that name different blocks run apart.
            for group in group_by(users, lambda s: s.cond["stg_block"] if kind == "stg" else None):
                extra[kind].update(zip(map(id, group), self._run_pass([(s, kind) for s in group])))
        for s in states:
            video_v, audio_v = self._guided_velocity(s, cond[id(s)], uncond.get(id(s)),
                                                     extra["stg"].get(id(s)), extra["modality"].get(id(s)))
            t = s.timesteps[s.step_index]
            s.latents = self._step_video(s, video_v, t)
            audio = s.cond["audio_latents"]
            s.cond["audio_latents"] = s.cond["audio_noise_scheduler"].step(audio_v, t, audio, return_dict=False)[0]
            s.step_index += 1

    def _run_pass(self, rows: list[tuple[DenoiseState, Pass]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One transformer call over `rows` -> per row its (video, audio) prediction as x0."""
        if not rows:
            return []
        states = [s for s, _ in rows]
        kind = rows[-1][1]  # "cond" closes a CFG call (uncond rows first, as diffusers concatenates)
        prompts = [s.cond["negative" if k == "uncond" else "prompt"] for s, k in rows]
        dtype = self.transformer.dtype
        t = torch.cat([s.timesteps[s.step_index].expand(1) for s in states])
        with self.transformer.cache_context("cond_uncond" if kind == "cond" else f"uncond_{kind}"):
            video, audio = self.transformer(
                hidden_states=torch.cat([s.latents for s in states]).to(dtype),
                audio_hidden_states=torch.cat([s.cond["audio_latents"] for s in states]).to(dtype),
                encoder_hidden_states=torch.cat([p["video"] for p in prompts]),
                audio_encoder_hidden_states=torch.cat([p["audio"] for p in prompts]),
                timestep=torch.cat([self._video_timestep(s) for s in states]),
                audio_timestep=t,
                sigma=t,
                encoder_attention_mask=torch.cat([p["mask"] for p in prompts]),
                audio_encoder_attention_mask=torch.cat([p["mask"] for p in prompts]),
                video_coords=torch.cat([s.cond["video_coords"] for s in states]),
                audio_coords=torch.cat([s.cond["audio_coords"] for s in states]),
                isolate_modalities=kind == "modality",
                spatio_temporal_guidance_blocks=[states[0].cond["stg_block"]] if kind == "stg" else None,
                use_cross_timestep=states[0].cond["use_cross_timestep"],
                return_dict=False,
            )
        for s in states:
            s.num_forwards += 1
        out = []
        for i, s in enumerate(states):
            video_sigma = s.noise_scheduler.sigmas[s.step_index]
            audio_sigma = s.cond["audio_noise_scheduler"].sigmas[s.step_index]
            out.append((s.latents - video[i: i + 1].float() * video_sigma,
                        s.cond["audio_latents"] - audio[i: i + 1].float() * audio_sigma))
        return out

    def _guided_velocity(self, state: DenoiseState, cond: tuple, uncond: tuple | None, stg: tuple | None,
                         modality: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
        """diffusers' guidance, per modality: x0_cond + CFG + STG + modality deltas, rescaled,
        back to a velocity for the noise scheduler."""
        from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

        scales = state.cond["scales"]
        out = []
        samples = (state.latents, state.cond["audio_latents"])
        sigmas = (state.noise_scheduler.sigmas[state.step_index], state.cond["audio_noise_scheduler"].sigmas[state.step_index])
        for i, name in enumerate(("video", "audio")):
            x0 = cond[i]
            cfg_delta = (scales[f"{name}_cfg"] - 1) * (x0 - uncond[i]) if uncond is not None else 0
            stg_delta = scales[f"{name}_stg"] * (x0 - stg[i]) if stg is not None else 0
            modality_delta = (scales[f"{name}_modality"] - 1) * (x0 - modality[i]) if modality is not None else 0
            guided = x0 + cfg_delta + stg_delta + modality_delta
            rescale = scales[f"{name}_rescale"]
            if rescale > 0:
                guided = rescale_noise_cfg(guided, x0, guidance_rescale=rescale)
            if name == "video":
                guided = self._blend_conditions(state, guided)
            out.append((samples[i] - guided) / sigmas[i])
        return out[0], out[1]

    def _blend_conditions(self, state: DenoiseState, x0: torch.Tensor) -> torch.Tensor:
        """The guided video x0 with the conditions' clean latents mixed in (conditions only)."""
        return x0

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_av(self, states: list[DenoiseState]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per state, (video [F, H, W, 3] floats in [0, 1], audio [channels, samples] floats):
        one VAE call per video shape, one audio VAE + vocoder call per audio shape."""
        videos = map_groups(states, lambda s: s.cond["video_shape"], self._decode_videos)
        audios = map_groups(states, lambda s: s.cond["audio_shape"], self._decode_audios)
        return list(zip(videos, audios))

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, lambda s: s.cond["video_shape"], self._decode_videos)

    @torch.no_grad()
    def decode(self, states: list[DenoiseState]) -> list[Any]:
        # As a first stage (its input processor asks for it), the latents go on: un-normalised, as
        # diffusers' output_type="latent", with the generator, which the second stage draws on from.
        handed_on = {id(s): LatentPayload(latents=self._denormalize(self._video_grid(s)), extras={
            "audio_latents": self._raw_audio(s), "generator_state": s.cond["generator"].get_state()})
            for s in states if s.request.condition.get("output") == "latents"}
        rest = [s for s in states if id(s) not in handed_on]
        decoded = dict(zip(map(id, rest), self._decode_payloads(rest))) if rest else {}
        return [handed_on.get(id(s)) or decoded[id(s)] for s in states]

    def _decode_payloads(self, states: list[DenoiseState]) -> list[VideoPayload]:
        sample_rate = int(self.vocoder.config.output_sampling_rate)
        return [self.to_av_payload(video, audio, state.request, sample_rate)
                for state, (video, audio) in zip(states, self.decode_av(states))]

    def _decode_videos(self, states: list[DenoiseState]) -> list[np.ndarray]:
        from diffusers.utils.torch_utils import randn_tensor

        latents = torch.cat([self._video_grid(s) for s in states]).to(self.transformer.dtype)
        timestep = None
        if self.vae.config.timestep_conditioning:
            # Each request's decode noise comes after its latents in its own generator.
            noise = torch.cat([randn_tensor((1, *latents.shape[1:]), generator=s.cond["generator"],
                                            device=self.device, dtype=latents.dtype) for s in states])
            decode_t = [s.request.params.extras["decode_timestep"] for s in states]
            noise_scale = [s.request.params.extras.get("decode_noise_scale") for s in states]
            noise_scale = [t if n is None else n for t, n in zip(decode_t, noise_scale)]
            timestep = torch.tensor(decode_t, device=self.device, dtype=latents.dtype)
            scale = torch.tensor(noise_scale, device=self.device, dtype=latents.dtype)[:, None, None, None, None]
            latents = (1 - scale) * latents + scale * noise
        latents = self._denormalize(latents).to(self.vae.dtype)
        if timestep is None:
            video = self.vae_decode(latents)
        else:
            video = self.vae.decode(latents, timestep, return_dict=False)[0]
        return list(self.video_processor.postprocess_video(video, output_type="np"))

    def _video_grid(self, state: DenoiseState) -> torch.Tensor:
        """The state's video latents as a [1, C, F, H, W] grid (keyframe conditions' tokens, after
        the video's, dropped)."""
        frames, h, w = state.cond["video_shape"]
        tokens = (frames // self.patch_size_t) * (h // self.patch_size) * (w // self.patch_size)
        return _unpack_latents(state.latents[:, :tokens], frames, h, w, self.patch_size, self.patch_size_t)

    def _raw_audio(self, state: DenoiseState) -> torch.Tensor:
        """The state's audio latents un-normalised, as a [1, C, L, M] spectrogram grid."""
        _, mel_bins = state.cond["audio_shape"]
        packed = state.cond["audio_latents"]
        mean = self.audio_vae.latents_mean.to(packed.device, packed.dtype)
        std = self.audio_vae.latents_std.to(packed.device, packed.dtype)
        return (packed * std + mean).unflatten(2, (-1, mel_bins)).transpose(1, 2)

    def _decode_audios(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([self._raw_audio(s) for s in states])  # [B, C, L, M]
        mel = self.audio_vae.decode(latents.to(self.audio_vae.dtype), return_dict=False)[0]
        waveform = self.vocoder(mel)  # [B, channels, samples]
        return [w.float().cpu().numpy() for w in waveform]


class LTX2I2V(LTX2T2V):
    """LTX2ImageToVideoPipeline: the image (H.264 re-compressed as LTX-2 was trained, resized,
    VAE-encoded) is the first latent frame; its tokens get timestep 0 and keep their latents
    through every step. The soundtrack is generated as in text-to-video."""

    reference_class: ClassVar[str] = "LTX2ImageToVideoPipeline"
    needs_image: ClassVar[bool] = True
    takes_latents: ClassVar[bool] = False
    # LTX2ImageToVideoPipeline.__call__ defaults.
    default_params: ClassVar[dict[str, Any]] = {**LTX2T2V.default_params, "width": 704, "num_frames": 161}
    extras: ClassVar[dict[str, ExtraSpec]] = {
        **LTX2T2V.extras,
        "image_crf": ExtraSpec(int, min=0, max=51, help="H.264 CRF the image is re-compressed at before encoding "
                                                        "(default: the checkpoint's, 33 through LTX-2.3); 0 = none."),
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        # diffusers resizes the conditioning image bilinearly.
        self.image_processor = VideoProcessor(vae_scale_factor=self.vae_spatial_ratio, resample="bilinear")

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        check_one_image(request)

    def _video_latents(self, request: DiffusionRequest, generator: torch.Generator, shape: tuple[int, int, int],
                       fps: float) -> dict[str, torch.Tensor]:
        """LTX2ImageToVideoPipeline.prepare_latents: the first frame's tokens take the image's
        normalised latents; the conditioning mask (1 on them) is kept per token."""
        noise = super()._video_latents(request, generator, shape, fps)["latents"]
        image = _conditioning_image(request.images[0], request.params.extras.get("image_crf"), self.text_encoder)
        pixels = self.image_processor.preprocess(image, height=request.params.height, width=request.params.width)
        image_latents = self._encode_frames(pixels.unsqueeze(2))  # [1, C, 1, h, w]
        frames, h, w = shape
        image_latents = self._pack_video(image_latents.repeat(1, 1, frames, 1, 1))
        mask = noise.new_zeros(1, 1, frames, h, w)
        mask[:, :, 0] = 1.0
        mask = self._pack_video(mask).squeeze(-1)  # [1, tokens]
        return {"latents": image_latents * mask[..., None] + noise * (1 - mask[..., None]), "conditioning_mask": mask}

    def _encode_frames(self, pixels: torch.Tensor) -> torch.Tensor:
        """[1, 3, F, H, W] pixels in [-1, 1] -> the VAE's normalised latents (its mode, no noise)."""
        encoded = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.mode().float()
        mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(encoded.device, encoded.dtype)
        std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(encoded.device, encoded.dtype)
        return (encoded - mean) / std

    def _video_timestep(self, state: DenoiseState) -> torch.Tensor:
        return state.timesteps[state.step_index] * (1 - state.cond["conditioning_mask"])

    def _step_video(self, state: DenoiseState, velocity: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # The step is per element: stepping every token and keeping the image's is diffusers'
        # step over the frames after the first.
        stepped = super()._step_video(state, velocity, t)
        return torch.where(state.cond["conditioning_mask"][..., None] > 0, state.latents, stepped)


class LTX2Condition(LTX2I2V):
    """LTX2ConditionPipeline: images at given latent frames (`condition_indices`, each with a
    `condition_strengths` weight). One at latent frame 0 overwrites the first frame's tokens;
    one at a later frame is appended as keyframe tokens placed at that frame in time (its own
    RoPE positions) and dropped before decoding. A token's mask is its strength: its timestep
    is t * (1 - mask), and each step's guided x0 is mixed towards the clean condition by it.
    Without images it is text-to-video."""

    reference_class: ClassVar[str] = "LTX2ConditionPipeline"
    needs_image: ClassVar[bool] = False
    takes_image: ClassVar[bool] = True  # any number of condition images
    default_params: ClassVar[dict[str, Any]] = LTX2T2V.default_params  # LTX2ConditionPipeline.__call__'s
    extras: ClassVar[dict[str, ExtraSpec]] = {
        **LTX2I2V.extras,
        "condition_indices": ExtraSpec(list, help="Latent frame of each input image, in order (negative counts "
                                                  "from the end; default [0] for one image)."),
        "condition_strengths": ExtraSpec(list, help="Strength in [0, 1] of each input image (default 1.0 each)."),
        "noise_scale": ExtraSpec(float, min=0, max=1, help="Noise level the conditions start from (default: a "
                                                           "fixed schedule's first sigma, else 1)."),
    }
    noises_conditions: ClassVar[bool] = True
    unscheduled_noise_scale: ClassVar[float] = 1.0  # LTX2ConditionPipeline's: the conditions start from noise

    def check_inputs(self, request: DiffusionRequest) -> None:
        import PIL.Image

        LTX2T2V.check_inputs(self, request)
        params, images = request.params, request.images
        for image in images:
            if not isinstance(image, PIL.Image.Image):
                raise RequestError("image", f"image: must be a PIL image, got {type(image).__name__}")
        indices = params.extras.get("condition_indices")
        if indices is None and len(images) > 1:
            raise RequestError("condition_indices", "extras.condition_indices: give the latent frame of each of "
                                                    f"the {len(images)} images")
        latent_frames = (params.num_frames - 1) // self.vae_temporal_ratio + 1
        for name, values, ok, what in (
            ("condition_indices", indices, lambda v: type(v) is int and -latent_frames <= v < latent_frames,
             f"an int in [-{latent_frames}, {latent_frames}) (latent frames of {params.num_frames} frames)"),
            ("condition_strengths", params.extras.get("condition_strengths"),
             lambda v: type(v) in (int, float) and 0 <= v <= 1, "a number in [0, 1]"),
        ):
            if values is None:
                continue
            if len(values) != len(images):
                raise RequestError(name, f"extras.{name}: one per input image ({len(images)}), got {len(values)}")
            bad = [v for v in values if not ok(v)]
            if bad:
                raise RequestError(name, f"extras.{name}: each must be {what}, got {bad[0]!r}")

    def _video_latents(self, request: DiffusionRequest, generator: torch.Generator, shape: tuple[int, int, int],
                       fps: float) -> dict[str, torch.Tensor]:
        """LTX2ConditionPipeline.prepare_latents: conditions written into (frame 0) or appended to
        (later frames) zero latents, then noise mixed in by 1 - mask over every token."""
        from diffusers.utils.torch_utils import randn_tensor

        params, images = request.params, request.images
        frames, h, w = shape
        channels = self.transformer.config.in_channels
        indices = params.extras.get("condition_indices") or [0] * len(images)
        strengths = params.extras.get("condition_strengths") or [1.0] * len(images)
        latents = self._pack_video(torch.zeros(1, channels, frames, h, w, device=self.device))
        mask = latents.new_zeros(latents.shape[:2])
        clean = torch.zeros_like(latents)
        keyframes, keyframe_masks, keyframe_coords = [], [], []
        for image, index, strength in zip(images, indices, strengths):
            index %= frames  # a negative index counts from the end
            cond = self._pack_video(self._encode_frames(self._condition_pixels(image, params)))
            if index == 0:  # the first frame's tokens
                latents[:, : cond.shape[1]] = cond
                mask[:, : cond.shape[1]] = strength
                clean[:, : cond.shape[1]] = cond
            else:  # keyframe tokens, placed at pixel frame (index - 1) * ratio + 1
                keyframes.append(cond)
                keyframe_masks.append(cond.new_full(cond.shape[:2], float(strength)))
                keyframe_coords.append(self._keyframe_coords(h, w, (index - 1) * self.vae_temporal_ratio + 1, fps))
        out: dict[str, torch.Tensor] = {}
        if keyframes:
            latents = torch.cat([latents, *keyframes], dim=1)
            mask = torch.cat([mask, *keyframe_masks], dim=1)
            clean = torch.cat([clean, *keyframes], dim=1)
            out["keyframe_coords"] = torch.cat(keyframe_coords, dim=2)
        noise = randn_tensor(latents.shape, generator=generator, device=self.device, dtype=latents.dtype)
        scaled = (1 - mask)[..., None] * self._noise_scale(request)
        return {**out, "latents": noise * scaled + latents * (1 - scaled), "conditioning_mask": mask,
                "clean_latents": clean}

    def _condition_pixels(self, image: Any, params: Any) -> torch.Tensor:
        """LTX2ConditionPipeline.preprocess_conditions for one image: re-compressed, scaled to
        cover the size (bilinear, no antialiasing), centre-cropped, in [-1, 1]: [1, 3, 1, H, W]."""
        image = _conditioning_image(image, params.extras.get("image_crf"), self.text_encoder)
        arr = np.array(image.convert("RGB"))
        pixels = torch.from_numpy(np.ascontiguousarray(arr)).to(self.device, torch.float32).permute(2, 0, 1)[None]
        src_h, src_w = arr.shape[:2]
        scale = max(params.height / src_h, params.width / src_w)
        new_h, new_w = math.ceil(src_h * scale), math.ceil(src_w * scale)
        pixels = torch.nn.functional.interpolate(pixels, size=(new_h, new_w), mode="bilinear", align_corners=False)
        top, left = (new_h - params.height) // 2, (new_w - params.width) // 2
        pixels = pixels[:, :, top: top + params.height, left: left + params.width]
        return (pixels / 127.5 - 1.0).unsqueeze(2)

    def _keyframe_coords(self, h: int, w: int, pixel_frame: int, fps: float) -> torch.Tensor:
        """[1, 3, tokens, 2] RoPE coordinates of a one-frame keyframe at `pixel_frame`
        (LTX2ConditionPipeline._prepare_keyframe_coords): pixel-space patch bounds, no causal
        shift, one pixel frame long, time in seconds."""
        steps = (self.patch_size_t, self.patch_size, self.patch_size)
        grid = torch.stack(torch.meshgrid(*(torch.arange(0, n, step, dtype=torch.float32, device=self.device)
                                            for n, step in zip((1, h, w), steps)), indexing="ij"))
        ends = grid + torch.tensor(steps, dtype=grid.dtype, device=self.device).view(3, 1, 1, 1)
        coords = torch.stack([grid, ends], dim=-1).flatten(1, 3).unsqueeze(0)  # [1, 3, tokens, 2]
        scales = torch.tensor((self.vae_temporal_ratio, self.vae_spatial_ratio, self.vae_spatial_ratio),
                              dtype=coords.dtype, device=self.device)
        coords = coords * scales.view(1, 3, 1, 1)
        coords[:, 0] = coords[:, 0] + pixel_frame
        coords[:, 0, :, 1:] = coords[:, 0, :, :1] + 1
        coords[:, 0] = coords[:, 0] / fps
        return coords

    def _audio_noise(self, generator: torch.Generator, frames: int, mel_bins: int) -> torch.Tensor:
        from diffusers.utils.torch_utils import randn_tensor

        # LTX2ConditionPipeline draws it in the packed shape, as the original LTX-2 code does.
        shape = (1, frames, self.audio_vae.config.latent_channels * mel_bins)
        return randn_tensor(shape, generator=generator, device=self.device, dtype=torch.float32)

    def _step_video(self, state: DenoiseState, velocity: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return LTX2T2V._step_video(self, state, velocity, t)  # every token steps (the blend holds conditions)

    def _blend_conditions(self, state: DenoiseState, x0: torch.Tensor) -> torch.Tensor:
        mask = state.cond["conditioning_mask"][..., None]
        return x0 * (1 - mask) + state.cond["clean_latents"] * mask


def _noised(latents: torch.Tensor, noise_scale: float, generator: torch.Generator) -> torch.Tensor:
    """LTX2Pipeline._create_noised_state: noise drawn (even at scale 0, as diffusers does) and mixed in."""
    from diffusers.utils.torch_utils import randn_tensor

    noise = randn_tensor(latents.shape, generator=generator, device=latents.device, dtype=latents.dtype)
    return noise_scale * noise + (1 - noise_scale) * latents


def _conditioning_image(image: Any, crf: int | None, text_encoder: Any) -> Any:
    """`image` H.264 re-compressed at `crf` (None: the checkpoint's default, 0: not at all), as
    LTX-2 was trained on and diffusers conditions on."""
    import PIL.Image
    from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf

    crf = resolve_default_image_crf(text_encoder) if crf is None else crf
    if crf == 0:
        return image
    return PIL.Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))


def _pack_latents(latents: torch.Tensor, patch_size: int, patch_size_t: int) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, tokens, C * p_t * p * p] (LTX2Pipeline._pack_latents)."""
    from diffusers import LTX2Pipeline

    return LTX2Pipeline._pack_latents(latents, patch_size, patch_size_t)


def _unpack_latents(latents: torch.Tensor, frames: int, height: int, width: int, patch_size: int,
                    patch_size_t: int) -> torch.Tensor:
    from diffusers import LTX2Pipeline

    return LTX2Pipeline._unpack_latents(latents, frames, height, width, patch_size, patch_size_t)
