"""Helios text-to-video: a UMT5 text encoder, a Wan-style 3D DiT that also reads short, mid and
long history latents, and the Wan 2.1 VAE.

Reproduces `diffusers.HeliosPipeline` (pipelines/helios/pipeline_helios.py, text-to-video) as
`HeliosT2V`, split at the encode / denoise_step / decode seams. Helios is chunk-autoregressive:
the video is made chunk by chunk (`num_latent_frames_per_chunk` latent frames each), every chunk
denoised from fresh noise over the same timesteps while it attends to the latents of the chunks
before it. So a request's steps are `num_chunks * num_inference_steps`; after the last step of
a chunk its latents join the history and are decoded, and that chunk of frames is ready to
stream (`take_chunks`) before the next chunk starts.

- The video has `ceil(num_frames / window)` chunks of `window` frames
  (`(num_latent_frames_per_chunk - 1) * 4 + 1`), trimmed at the end to 4k + 1 frames, as
  diffusers does: the output's frame count is not always `num_frames`.
- Every chunk draws its noise from the request's one generator, in order, as diffusers does.
- The prompt of a running request may change (`update_prompt`, the realtime video session's
  `session.interaction`): from the next chunk on, its embeddings move linearly from the ones in
  use to the new prompt's over `transition_chunks` chunks (0 or 1: at once). A newer update
  replaces one still pending or in transition. diffusers has no such input; without updates
  the output is diffusers' own.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.core.types import VideoPayload
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    encode_prompts_by_length,
    split_per_state,
)
from omnistage.models.wan.pipeline import latent_stats, umt5_prompt_embeds


def _guidance_scale(state: DenoiseState) -> float | None:
    return None if state.cond["negative_prompt_embeds"] is None else state.cond["guidance_scale"]


def _call_default(name: str) -> Any:
    from diffusers import HeliosPipeline

    return inspect.signature(HeliosPipeline.__call__).parameters[name].default


class HeliosT2V(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "HeliosPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        vae_tiling=True, offload=True, quantization=True, lora=True, compile=True,
        refused={"cache_backend": "no step-cache block chain is written for its history-reading blocks",
                 "ulysses_degree": "no sequence-parallel plan is written for its history tokens",
                 "cfg_parallel_size": "its chunk loop is not split over ranks"})
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->transformer->vae"
    output_modality: ClassVar[str] = "video"
    takes_prompt_updates: ClassVar[bool] = True
    # HeliosPipeline.__call__ defaults (fps: its example exports at 24).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 384,
        "width": 640,
        "num_frames": 132,
        "fps": 24,
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, max_from=("tokenizer",), default=512, min=1,
                                         help="UMT5 prompt tokens (embeddings are zero-padded to this length)."),
        "num_latent_frames_per_chunk": ExtraSpec(
            int, default=9, min=1, max=64, help="Latent frames per generated chunk (4 frames each after the first)."),
    }
    # Plain CFG, one transformer call per branch as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(scale=_guidance_scale, combine=plain_cfg)

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        super().__init__(components, device, dtype, configs)
        from diffusers.video_processor import VideoProcessor

        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_scale_factor_spatial)
        # The history the transformer reads, long to short (diffusers' call default, sorted as it does).
        self.history_sizes = sorted(_call_default("history_sizes"), reverse=True)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor_temporal = configs.vae.get("scale_factor_temporal", 4)
        self.vae_scale_factor_spatial = configs.vae.get("scale_factor_spatial", 8)
        self.patch_size = tuple(configs.transformer.get("patch_size", (1, 2, 2)))
        self.scheduler_config = dict(configs.scheduler)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        # HeliosPipeline.check_inputs; the long-history patch (4 x the spatial patch) must also fit.
        long_patch = self.vae_scale_factor_spatial * 4 * max(self.patch_size[1:])
        check_divisible(params, height=max(16, long_patch), width=max(16, long_patch))
        if params.num_frames < 1:
            raise RequestError("num_frames", f"num_frames must be >= 1, got {params.num_frames}")
        if params.num_outputs_per_prompt != 1:
            raise RequestError("num_outputs_per_prompt",
                               f"num_outputs_per_prompt must be 1 for video, got {params.num_outputs_per_prompt}")
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not used by Helios (its CFG scale is guidance_scale)")

    def num_chunks(self, request: DiffusionRequest) -> int:
        window = self._window(request)
        return max(1, (request.params.num_frames + window - 1) // window)

    def _window(self, request: DiffusionRequest) -> int:
        """Frames per chunk."""
        return (request.params.extras["num_latent_frames_per_chunk"] - 1) * self.vae_scale_factor_temporal + 1

    # -- 2. encode: prompts, history, timesteps ---------------------------------------------

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        embeds = encode_prompts_by_length(
            requests,
            uses_cfg=lambda r: r.params.guidance_scale > 1,
            encode=lambda texts, max_len: umt5_prompt_embeds(self.tokenizer, self.text_encoder, texts, max_len,
                                                             self.device, self.transformer.dtype).split(1),
        )
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: torch.Tensor,
                       negative: torch.Tensor | None) -> DenoiseState:
        from diffusers.pipelines.helios.pipeline_helios import calculate_shift

        params = request.params
        chunk = params.extras["num_latent_frames_per_chunk"]
        latent_h = params.height // self.vae_scale_factor_spatial
        latent_w = params.width // self.vae_scale_factor_spatial
        # Every chunk runs the same timesteps: sigmas from 0.999 down, shifted for the chunk's token count.
        p_t, p_h, p_w = self.patch_size
        mu = calculate_shift(chunk * latent_h * latent_w // (p_t * p_h * p_w),
                             self.scheduler_config.get("base_image_seq_len", 256),
                             self.scheduler_config.get("max_image_seq_len", 4096),
                             self.scheduler_config.get("base_shift", 0.5),
                             self.scheduler_config.get("max_shift", 1.15))
        sigmas = np.linspace(0.999, 0.0, params.num_inference_steps + 1)[:-1]
        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device, sigmas=sigmas, mu=mu)
        num_chunks = self.num_chunks(request)
        channels = self.transformer.config.in_channels
        cond = {
            "prompt_embeds": prompt, "negative_prompt_embeds": negative, "guidance_scale": params.guidance_scale,
            "generator": self.generator_for(request),  # one noise source for every chunk, in order
            "sigmas": sigmas, "mu": mu, "chunk_timesteps": noise_scheduler.timesteps,
            "history": torch.zeros(1, channels, sum(self.history_sizes), latent_h, latent_w,
                                   device=self.device, dtype=torch.float32),
            "prefix": None,  # the first frame's latent, the head of the short history (keep_first_frame)
            "num_generated": 0,  # latent frames made so far
            "chunks": [],  # every decoded chunk [1, 3, F, H, W], in order
            "num_taken": 0,  # chunks `take_chunks` has handed out
            "pending": None,  # a prompt update that starts with the next chunk
            "transition": None,  # the update in progress: event id, from/to embeddings, chunks done of N
            "chunk_events": [{}],  # per chunk, the update events that started / were active / completed in it
        }
        # One timestep list for the whole request, so the engine's step count and progress cover every chunk.
        state = DenoiseState(request=request, latents=None, noise_scheduler=noise_scheduler,
                             timesteps=noise_scheduler.timesteps.repeat(num_chunks), cond=cond)
        self._start_chunk(state)
        return state

    def _start_chunk(self, state: DenoiseState) -> None:
        """Fresh noise for the next chunk and its scheduler reset (the top of diffusers' chunk loop)."""
        from diffusers.utils.torch_utils import randn_tensor

        cond, request = state.cond, state.request
        if state.step_index > 0:  # the first chunk's timesteps were set in encode
            state.noise_scheduler.set_timesteps(request.params.num_inference_steps, device=self.device,
                                                sigmas=cond["sigmas"], mu=cond["mu"])
            cond["chunk_events"].append(self._advance_prompt(cond))
        history = cond["history"]
        shape = (1, history.shape[1], request.params.extras["num_latent_frames_per_chunk"], *history.shape[3:])
        state.latents = randn_tensor(shape, generator=cond["generator"], device=self.device, dtype=torch.float32)

    @torch.no_grad()
    def update_prompt(self, state: DenoiseState, update: dict[str, Any]) -> None:
        """The new prompt is encoded now and used from the next chunk (see the module docstring)."""
        max_len = state.request.params.extras["max_sequence_length"]
        embeds = umt5_prompt_embeds(self.tokenizer, self.text_encoder, [update["prompt"]], max_len,
                                    self.device, self.transformer.dtype)
        state.cond["pending"] = (str(update["event_id"]), embeds, max(1, int(update["transition_chunks"])))

    @staticmethod
    def _advance_prompt(cond: dict[str, Any]) -> dict[str, list[str]]:
        """The prompt embeddings of the chunk that starts; the update events it started, was
        in the middle of and completed."""
        events: dict[str, list[str]] = {"started": [], "active": [], "completed": []}
        if cond["pending"] is not None:
            event_id, target, num_chunks = cond["pending"]
            cond["pending"] = None
            cond["transition"] = [event_id, cond["prompt_embeds"], target, 0, num_chunks]
            events["started"].append(event_id)
        if cond["transition"] is not None:
            event_id, source, target, done, num_chunks = cond["transition"]
            done += 1
            cond["prompt_embeds"] = source + (target - source) * (done / num_chunks)
            events["active"].append(event_id)
            if done == num_chunks:
                cond["prompt_embeds"], cond["transition"] = target, None
                events["completed"].append(event_id)
            else:
                cond["transition"][3] = done
        return events

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs equal latent and history shapes and prompt lengths.
        def key(s: DenoiseState) -> tuple:
            return tuple(s.latents.shape[1:]), s.cond["prompt_embeds"].shape[1]

        self.guided_steps(states, key, self._predict, self._step)

    def _history_inputs(self, state: DenoiseState) -> dict[str, torch.Tensor]:
        """The transformer's history latents and frame indices for the state's current chunk
        (keep_first_frame: the short history starts with the first frame's latent)."""
        cond, sizes = state.cond, self.history_sizes
        long, mid, short_1x = cond["history"][:, :, -sum(sizes):].split(sizes, dim=2)
        prefix = cond["prefix"] if cond["prefix"] is not None else torch.zeros_like(short_1x[:, :, :1])
        chunk = state.latents.shape[2]
        indices = torch.arange(0, sum([1, *sizes, chunk]))
        i_prefix, i_long, i_mid, i_1x, i_chunk = indices.split([1, *sizes, chunk], dim=0)
        return {
            "latents_history_short": torch.cat([prefix, short_1x], dim=2),
            "latents_history_mid": mid,
            "latents_history_long": long,
            "indices_hidden_states": i_chunk.unsqueeze(0),
            "indices_latents_history_short": torch.cat([i_prefix, i_1x]).unsqueeze(0),
            "indices_latents_history_mid": i_mid.unsqueeze(0),
            "indices_latents_history_long": i_long.unsqueeze(0),
        }

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        states = [s for s, _ in rows]
        dtype = self.transformer.dtype
        history = [self._history_inputs(s) for s in states]
        latents = {name: torch.cat([h[name] for h in history]).to(dtype) for name in history[0]
                   if name.startswith("latents_")}
        indices = {name: value for name, value in history[0].items() if name.startswith("indices_")}
        prefix = ["" if branch == "cond" else "negative_" for _, branch in rows]
        noise_pred = self.transformer(
            hidden_states=torch.cat([s.latents for s in states]).to(dtype),
            timestep=torch.cat([s.timesteps[s.step_index].expand(1) for s in states]),
            encoder_hidden_states=torch.cat([s.cond[p + "prompt_embeds"] for s, p in zip(states, prefix)]),
            **indices, **latents, return_dict=False,
        )[0]
        return split_per_state(noise_pred, states)

    def _step(self, state: DenoiseState, noise_pred: torch.Tensor) -> None:
        cond = state.cond
        t = state.timesteps[state.step_index]
        state.latents = state.noise_scheduler.step(noise_pred, t, state.latents, generator=cond["generator"],
                                                   return_dict=False)[0]
        state.step_index += 1
        if state.step_index % state.request.params.num_inference_steps == 0:
            self._finish_chunk(state)
            if not state.is_done:
                self._start_chunk(state)

    def _finish_chunk(self, state: DenoiseState) -> None:
        """The chunk's latents join the history and are decoded (the bottom of diffusers' chunk loop)."""
        cond, latents = state.cond, state.latents
        if cond["prefix"] is None:
            cond["prefix"] = latents[:, :, :1]
        cond["num_generated"] += latents.shape[2]
        cond["history"] = torch.cat([cond["history"], latents], dim=2)
        mean, inv_std = latent_stats(self.vae, latents.shape[1], self.device, self.vae.dtype)
        video = self.vae_decode(latents.to(self.vae.dtype) / inv_std + mean)
        if state.is_done:  # diffusers trims the whole video to 4k + 1 frames
            total = sum(c.shape[2] for c in cond["chunks"]) + video.shape[2]
            keep = (total - 1) // self.vae_scale_factor_temporal * self.vae_scale_factor_temporal + 1
            video = video[:, :, : video.shape[2] - (total - keep)]
        cond["chunks"].append(video)

    # -- 4. decode ------------------------------------------------------------------------

    def take_chunks(self, states: list[DenoiseState]) -> list[tuple[DenoiseState, VideoPayload]]:
        """The chunks of frames decoded since the last call, as streamed pieces (`is_chunk`);
        the state keeps them for its whole video."""
        out = []
        for state in states:
            cond = state.cond
            for index in range(cond["num_taken"], len(cond["chunks"])):
                arr = self.video_processor.postprocess_video(cond["chunks"][index], output_type="np")[0]
                payload = self.to_payload(arr, state.request)
                events = cond["chunk_events"][index]
                out.append((state, VideoPayload(payload.frames, payload.fps, is_chunk=True,
                                                events=events if any(events.values()) else None)))
            cond["num_taken"] = len(cond["chunks"])
        return out

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # Every chunk was decoded as it finished; the video is their frames in order.
        return [self.video_processor.postprocess_video(torch.cat(s.cond["chunks"], dim=2), output_type="np")[0]
                for s in states]
