"""Stable Audio (Open): a T5 text encoder and seconds conditioning -> a 1D DiT -> the Oobleck VAE.

Reproduces `diffusers.StableAudioPipeline` (pipelines/stable_audio/pipeline_stable_audio.py),
split at the encode / denoise_step / decode seams:

- encode: T5 embeds the prompt, padded to the tokenizer's model_max_length; the projection
  model maps it and the requested `audio_start_in_s` / `audio_end_in_s` into the
  conditioning space. The transformer cross-attends to [prompt, start, end] and takes
  [start, end] side by side as its global state.
- denoise_step: every request has the same latent length (the transformer's sample_size,
  whatever the duration), so one transformer call takes all of them, cond and uncond rows
  together as diffusers batches them. The noise scheduler (EDM DPM-Solver, stochastic in the
  real checkpoint) draws its noise from the request's own generator.
- decode: the VAE decodes the whole window; each request keeps [start, end) of it.

CFG runs when guidance_scale > 1. With a negative prompt the uncond rows cross-attend to
its (masked) embeddings; without one, diffusers' uncond conditioning is all zeros.
Not supported: `initial_audio_waveforms` (audio-to-audio), several waveforms per request.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.accel.step_cache import BlockChain
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import DiffusionParams, ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    latent_shape,
    split_per_state,
)
from omnistage.core.errors import RequestError
from omnistage.core.types import AudioPayload
from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, Accelerations

# DiffusionParams fields an audio request has no use for: refused rather than ignored.
_IMAGE_FIELDS = ("height", "width", "num_frames", "fps", "true_cfg_scale", "guidance_scale_2")


class StableAudio(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "StableAudioPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        step_caches=CACHE_BACKENDS, cfg_parallel=True, vae_tiling=True, offload=True, quantization=True,
        refused={"lora": "diffusers has no LoRA loader for it", "compile": "its transformer declares no repeated blocks"})
    output_modality: ClassVar[str] = "audio"
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->projection_model->transformer->vae"
    # StableAudioPipeline.__call__ defaults; audio_end_in_s (the model's longest window) depends
    # on the checkpoint and is filled in configure.
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 100,
        "guidance_scale": 7.0,
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        super().__init__(components, device, dtype, configs)
        self.rotary_embed_dim = self.transformer.config.attention_head_dim // 2
        self._rotary: tuple[torch.Tensor, torch.Tensor] | None = None
        # A stochastic noise scheduler (the real checkpoint's) draws noise from the generator it is given.
        self._step_takes_generator = "generator" in inspect.signature(self.noise_scheduler.step).parameters

    def configure(self, configs: CheckpointConfigs) -> None:
        # The VAE's hop length and rate and the transformer's window fix the longest audio.
        self.sampling_rate = configs.vae.sampling_rate
        self.hop_length = math.prod(configs.vae.downsampling_ratios)
        self.sample_size = configs.transformer.sample_size
        self.max_audio_seconds = self.sample_size * self.hop_length / self.sampling_rate
        # The projection model embeds seconds in [min_value, max_value] (0-512 in the real one).
        self.min_seconds = configs.projection_model.min_value
        self.max_seconds = configs.projection_model.max_value
        self.extras = {
            "audio_start_in_s": ExtraSpec(float, default=0.0, min=self.min_seconds, max=self.max_seconds,
                                          help="Where the audio starts in the model's window (seconds)."),
            "audio_end_in_s": ExtraSpec(float, default=self.max_audio_seconds, min=self.min_seconds,
                                        max=self.max_seconds,
                                        help=f"Where it ends; at most {self.max_audio_seconds:g} s after the start."),
        }

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params
        for name in _IMAGE_FIELDS:
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not a parameter of an audio model")
        if params.num_outputs_per_prompt != 1:
            raise RequestError("num_outputs_per_prompt", f"num_outputs_per_prompt must be 1 for audio, got {params.num_outputs_per_prompt}")
        if params.partial_images:
            raise RequestError("partial_images", "partial_images: an audio model has no previews")
        start, end = params.extras["audio_start_in_s"], params.extras["audio_end_in_s"]
        if end <= start:
            raise RequestError("audio_end_in_s", f"audio_end_in_s must be greater than audio_start_in_s ({start:g}), got {end:g}")
        if end - start > self.max_audio_seconds:
            raise RequestError("audio_end_in_s", f"audio_end_in_s - audio_start_in_s must be at most {self.max_audio_seconds:g} s "
                               f"(this model's window), got {end - start:g}")

    def batch_key(self, params: DiffusionParams) -> tuple:
        # Every request has the same latent length: durations and prompts mix freely.
        return (params.num_inference_steps, params.guidance_scale, params.lora)

    # -- 2. encode: prompts, seconds, initial noise, timesteps ------------------------------

    def _encode_texts(self, texts: list[str], zero_padding: list[bool]) -> torch.Tensor:
        """Projected T5 embeddings [N, model_max_length, D], zero at padding positions
        (StableAudioPipeline.encode_prompt). `zero_padding[i]` also zeroes row i's encoder
        output at padding before the projection, as diffusers does for negative prompts."""
        tokens = self.tokenizer(texts, padding="max_length", max_length=self.tokenizer.model_max_length,
                                truncation=True, return_tensors="pt")
        mask = tokens.attention_mask.to(self.device)
        embeds = self.text_encoder(tokens.input_ids.to(self.device), attention_mask=mask)[0]
        zeroed = torch.where(mask.to(torch.bool).unsqueeze(2), embeds, 0.0)
        rows = torch.tensor(zero_padding, device=self.device).view(-1, 1, 1)
        embeds = torch.where(rows, zeroed, embeds)
        projected = self.projection_model(text_hidden_states=embeds).text_hidden_states
        return projected * mask.unsqueeze(-1).to(projected.dtype)

    def _encode_seconds(self, requests: list[DiffusionRequest]) -> tuple[torch.Tensor, torch.Tensor]:
        """The projected start and end seconds of each request, [N, 1, D] each."""
        def seconds(name: str) -> torch.Tensor:
            return torch.tensor([float(r.params.extras[name]) for r in requests], device=self.device)

        out = self.projection_model(start_seconds=seconds("audio_start_in_s"), end_seconds=seconds("audio_end_in_s"))
        return out.seconds_start_hidden_states, out.seconds_end_hidden_states

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # One text-encoder call over the prompts, then the negative prompts of guided requests.
        negatives = [i for i, r in enumerate(requests) if _uses_cfg(r) and r.params.negative_prompt is not None]
        texts = [r.prompt for r in requests] + [requests[i].params.negative_prompt for i in negatives]
        embeds = self._encode_texts(texts, [False] * len(requests) + [True] * len(negatives)).split(1)
        negative_of = dict(zip(negatives, embeds[len(requests):]))
        starts, ends = self._encode_seconds(requests)
        return [self._initial_state(r, embeds[i], negative_of.get(i), starts[i:i + 1], ends[i:i + 1])
                for i, r in enumerate(requests)]

    def _initial_state(self, request: DiffusionRequest, prompt: torch.Tensor, negative: torch.Tensor | None,
                       start: torch.Tensor, end: torch.Tensor) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        text_duration = torch.cat([prompt, start, end], dim=1)  # [1, tokens + 2, D]
        if not _uses_cfg(request):
            negative_text_duration = None
        elif negative is not None:
            negative_text_duration = torch.cat([negative, start, end], dim=1)
        else:  # no negative prompt: diffusers' uncond conditioning is zeros, seconds included
            negative_text_duration = torch.zeros_like(text_duration)

        noise_scheduler = self.noise_scheduler_copy()
        noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
        generator = self.generator_for(request)
        shape = (1, self.transformer.config.in_channels, self.sample_size)
        latents = randn_tensor(shape, generator=generator, device=self.device, dtype=text_duration.dtype)
        latents = latents * noise_scheduler.init_noise_sigma
        cond = {
            "text_duration_embeds": text_duration,
            "negative_text_duration_embeds": negative_text_duration,
            "duration_embeds": torch.cat([start, end], dim=2),  # [1, 1, 2D], the same for both branches
            "guidance_scale": params.guidance_scale,
            # The generator goes on drawing the noise scheduler's noise at every step, as in diffusers.
            "generator": generator,
        }
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_scheduler, timesteps=noise_scheduler.timesteps,
                            cond=cond)

    # -- 3. denoise -----------------------------------------------------------------------

    # Plain CFG when guidance_scale > 1; both branches in one transformer call, as in diffusers.
    guidance: ClassVar[Guidance] = Guidance(
        scale=lambda s: s.cond["guidance_scale"] if s.cond["negative_text_duration_embeds"] is not None else None,
        combine=plain_cfg,
        batch_branches=True,
    )

    # Step caches wrap the DiT blocks (called with keywords only). The time embedding rides in
    # the prepended global token, not in a modulation: TeaCache compares the first block's
    # normed input as it is (no published coefficients for Stable Audio: no rescaling).
    step_cache_blocks: ClassVar[BlockChain] = BlockChain(
        blocks=("transformer_blocks",),
        io="single_stream",
        modulated_input=lambda block, args, kwargs: block.norm1(kwargs["hidden_states"]),
    )

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One transformer call needs equal latent and prompt lengths (equal for one checkpoint).
        self.guided_steps(states, lambda s: (latent_shape(s), s.cond["text_duration_embeds"].shape[1]), self._predict,
                          self._noise_scheduler_step)

    def _rotary_embedding(self) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE over [global state, latent frames]: one table for every request."""
        if self._rotary is None:
            from diffusers.models.embeddings import get_1d_rotary_pos_embed

            cos, sin = get_1d_rotary_pos_embed(self.rotary_embed_dim, self.sample_size + 1, use_real=True,
                                               repeat_interleave_real=False)
            self._rotary = (cos.to(self.device), sin.to(self.device))
        return self._rotary

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One transformer call over every (state, branch) row; one prediction per row."""
        row_states = [s for s, _ in rows]
        # The noise scheduler scales its input by the state's current sigma (EDM preconditioning).
        scaled = {id(s): s.noise_scheduler.scale_model_input(s.latents, s.timesteps[s.step_index]) for s in row_states}
        noise_pred = self.transformer(
            torch.cat([scaled[id(s)] for s in row_states]),
            torch.cat([s.timesteps[s.step_index].expand(s.latents.shape[0]) for s in row_states]),
            encoder_hidden_states=torch.cat([
                s.cond["text_duration_embeds" if branch == "cond" else "negative_text_duration_embeds"]
                for s, branch in rows
            ]),
            global_hidden_states=torch.cat([s.cond["duration_embeds"] for s in row_states]),
            rotary_embedding=self._rotary_embedding(),
            return_dict=False,
        )[0]
        return split_per_state(noise_pred, row_states)

    def _noise_scheduler_step(self, state: DenoiseState, noise_pred: torch.Tensor) -> None:
        """x_t -> x_t-1 with the state's noise scheduler; a stochastic one draws from its generator."""
        kwargs = {"generator": state.cond["generator"]} if self._step_takes_generator else {}
        t = state.timesteps[state.step_index]
        state.latents = state.noise_scheduler.step(noise_pred, t, state.latents, return_dict=False, **kwargs)[0]
        state.step_index += 1

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        """One VAE call over every state's window; each keeps its [start, end) samples as
        float32 [num_outputs, channels, samples] (diffusers' `output_type="np"`)."""
        audio = self.vae_decode(torch.cat([s.latents for s in states]).to(self.vae.dtype))
        out = []
        for state, waveforms in zip(states, split_per_state(audio, states)):
            extras = state.request.params.extras
            start = int(extras["audio_start_in_s"] * self.sampling_rate)
            end = int(extras["audio_end_in_s"] * self.sampling_rate)
            out.append(waveforms[:, :, start:end].cpu().float().numpy())
        return out

    def to_payload(self, arr: np.ndarray, request: DiffusionRequest) -> AudioPayload:
        """[1, channels, samples] -> an AudioPayload of [samples] (mono) or [samples, channels]."""
        waveform = arr[0].T.astype(np.float32)
        return AudioPayload(audio=waveform[:, 0] if waveform.shape[1] == 1 else waveform,
                            sample_rate=self.sampling_rate)


def _uses_cfg(request: DiffusionRequest) -> bool:
    return request.params.guidance_scale > 1
