"""LTX-2 text/image -> video with its soundtrack: one audio-video DiT denoises both at once.

Reproduces `diffusers.LTX2Pipeline` (pipelines/ltx2/pipeline_ltx2.py) as `LTX2T2V` and
`LTX2ImageToVideoPipeline` (pipeline_ltx2_image2video.py) as `LTX2I2V`, split at the encode /
denoise_step / decode seams (image-to-video differs only in the first latent frame, see LTX2I2V):

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

import math
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
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
)
from omnistage.core.errors import RequestError
from omnistage.core.types import VideoPayload
from omnistage.diffusion.accel.declaration import Accelerations

# diffusers' default STG block (LTX-2.3's recommendation; LTX-2.0's is 29). As in diffusers, a
# default past the transformer's last block perturbs nothing.
DEFAULT_STG_BLOCK = 28

# The passes of one step: which prompt each row uses and how the transformer runs it.
Pass = str  # "uncond" | "cond" | "stg" | "modality"


class LTX2T2V(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "LTX2Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        vae_tiling=True, offload=True, quantization=True, lora=True, compile=True,
        refused={"cfg_parallel_size": "it runs its own multi-pass guidance (CFG, STG, modality)",
                 "cache_backend": "its audio-video blocks have no cache hook"})
    output_modality: ClassVar[str] = "video"
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
    }

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_spatial_ratio)

    def configure(self, configs: CheckpointConfigs) -> None:
        vae = configs.vae
        scaling = sum(vae.get("spatio_temporal_scaling", ()))
        self.vae_spatial_ratio = vae.get("spatial_compression_ratio") or vae.get("patch_size", 1) * 2 ** scaling
        self.vae_temporal_ratio = vae.get("temporal_compression_ratio") or vae.get("patch_size_t", 1) * 2 ** scaling
        self.patch_size = configs.transformer.get("patch_size", 1)
        self.patch_size_t = configs.transformer.get("patch_size_t", 1)
        self.num_blocks = configs.transformer.get("num_layers", 0)
        # diffusers requires multiples of 32; the latent grid must also be whole.
        self.size_multiple_of = math.lcm(32, self.vae_spatial_ratio * self.patch_size)
        audio = configs.audio_vae
        self.audio_latent_ratio = 4  # AutoencoderKLLTX2Audio's fixed mel / time downsampling
        self.audio_latents_per_second = (audio.get("sample_rate", 16000) / audio.get("mel_hop_length", 160)
                                         / self.audio_latent_ratio)

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        params = request.params  # defaults filled (prepare_request)
        check_divisible(params, height=self.size_multiple_of, width=self.size_multiple_of)
        check_video_frames(params, self.vae_temporal_ratio)
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: LTX-2 does not take it (its guidance knobs are extras)")
        block = params.extras.get("stg_block")
        if block is not None and block >= self.num_blocks:
            raise RequestError("stg_block", f"extras.stg_block must be < {self.num_blocks} (the transformer's blocks), "
                               f"got {block}")

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
        from diffusers.utils.torch_utils import randn_tensor

        params, extras = request.params, request.params.extras
        generator = self.generator_for(request)
        num_latent_frames = (params.num_frames - 1) // self.vae_temporal_ratio + 1
        latent_h, latent_w = params.height // self.vae_spatial_ratio, params.width // self.vae_spatial_ratio
        # 1. Video noise, then audio noise, from the request's generator (diffusers' order).
        channels = self.transformer.config.in_channels
        video = randn_tensor((1, channels, num_latent_frames, latent_h, latent_w), generator=generator,
                             device=self.device, dtype=torch.float32)
        latents = self._pack_video(video)
        audio_frames = round(params.num_frames / params.fps * self.audio_latents_per_second)
        mel_bins = self.audio_vae.config.mel_bins // self.audio_latent_ratio
        audio = randn_tensor((1, self.audio_vae.config.latent_channels, audio_frames, mel_bins), generator=generator,
                             device=self.device, dtype=torch.float32)
        audio_latents = audio.transpose(1, 2).flatten(2, 3)  # [1, L, C * M]

        # 2. Flow-matching sigmas shifted by the video token count; audio has its own copy.
        steps = params.num_inference_steps
        config = self.noise_scheduler.config
        mu = calculate_shift(latents.shape[1], config.get("base_image_seq_len", 1024),
                             config.get("max_image_seq_len", 4096), config.get("base_shift", 0.95),
                             config.get("max_shift", 2.05))
        sigmas = np.linspace(1.0, 1 / steps, steps)
        noise_schedulers = []
        for _ in range(2):
            noise_scheduler = self.noise_scheduler_copy()
            timesteps, _ = retrieve_timesteps(noise_scheduler, steps, self.device, sigmas=sigmas, mu=mu)
            noise_scheduler.set_begin_index(0)
            noise_schedulers.append(noise_scheduler)

        # 3. RoPE positions, fixed for the whole run.
        fps = conditioning_frame_rate(params.fps, extras["motion_speed"])
        video_coords = self.transformer.rope.prepare_video_coords(1, num_latent_frames, latent_h, latent_w,
                                                                  self.device, fps=fps)
        audio_coords = self.transformer.audio_rope.prepare_audio_coords(1, audio_frames, self.device)
        cond = {
            "prompt": prompt, "negative": negative, "scales": self._scales(request),
            "audio_latents": audio_latents, "audio_noise_scheduler": noise_schedulers[1],
            "video_coords": video_coords, "audio_coords": audio_coords,
            "video_shape": (num_latent_frames, latent_h, latent_w), "audio_shape": (audio_frames, mel_bins),
            "stg_block": DEFAULT_STG_BLOCK if extras.get("stg_block") is None else extras["stg_block"],
            "use_cross_timestep": extras["use_cross_timestep"],
            "generator": generator,  # a timestep-conditioned VAE draws its decode noise from it
        }
        state = DenoiseState(request=request, latents=latents, noise_scheduler=noise_schedulers[0],
                             timesteps=timesteps, cond=cond)
        self._condition(state)
        return state

    def _condition(self, state: DenoiseState) -> None:
        """Image-to-video pins the first latent frame here; text-to-video has nothing to add."""

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
            return (s.cond["video_shape"], s.cond["audio_shape"], s.cond["prompt"]["video"].shape[1],
                    s.cond["use_cross_timestep"])

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
            out.append((samples[i] - guided) / sigmas[i])
        return out[0], out[1]

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
        sample_rate = int(self.vocoder.config.output_sampling_rate)
        payloads = []
        for state, (video, audio) in zip(states, self.decode_av(states)):
            payload = self.to_payload(video, state.request)
            payloads.append(VideoPayload(frames=payload.frames, fps=payload.fps, audio=audio.astype(np.float32),
                                         sample_rate=sample_rate))
        return payloads

    def _decode_videos(self, states: list[DenoiseState]) -> list[np.ndarray]:
        from diffusers.utils.torch_utils import randn_tensor

        frames, h, w = states[0].cond["video_shape"]
        latents = torch.cat([_unpack_latents(s.latents, frames, h, w, self.patch_size, self.patch_size_t)
                             for s in states]).to(self.transformer.dtype)
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
        mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(latents.device, latents.dtype)
        latents = (latents * std / self.vae.config.scaling_factor + mean).to(self.vae.dtype)
        if timestep is None:
            video = self.vae_decode(latents)
        else:
            video = self.vae.decode(latents, timestep, return_dict=False)[0]
        return list(self.video_processor.postprocess_video(video, output_type="np"))

    def _decode_audios(self, states: list[DenoiseState]) -> list[np.ndarray]:
        audio_frames, mel_bins = states[0].cond["audio_shape"]
        packed = torch.cat([s.cond["audio_latents"] for s in states])
        mean = self.audio_vae.latents_mean.to(packed.device, packed.dtype)
        std = self.audio_vae.latents_std.to(packed.device, packed.dtype)
        latents = (packed * std + mean).unflatten(2, (-1, mel_bins)).transpose(1, 2)  # [B, C, L, M]
        mel = self.audio_vae.decode(latents.to(self.audio_vae.dtype), return_dict=False)[0]
        waveform = self.vocoder(mel)  # [B, channels, samples]
        return [w.float().cpu().numpy() for w in waveform]


class LTX2I2V(LTX2T2V):
    """LTX2ImageToVideoPipeline: the image (H.264 re-compressed as LTX-2 was trained, resized,
    VAE-encoded) is the first latent frame; its tokens get timestep 0 and keep their latents
    through every step. The soundtrack is generated as in text-to-video."""

    reference_class: ClassVar[str] = "LTX2ImageToVideoPipeline"
    needs_image: ClassVar[bool] = True
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

    def _condition(self, state: DenoiseState) -> None:
        """LTX2ImageToVideoPipeline.prepare_latents: the first frame's tokens take the image's
        normalised latents; the conditioning mask (1 on them) is kept per token."""
        import PIL.Image
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf, resolve_default_image_crf

        params = state.request.params
        image = state.request.images[0]
        crf = params.extras.get("image_crf")
        crf = resolve_default_image_crf(self.text_encoder) if crf is None else crf
        if crf != 0:
            image = PIL.Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), crf))
        pixels = self.image_processor.preprocess(image, height=params.height, width=params.width)
        pixels = pixels.to(self.device, self.vae.dtype).unsqueeze(2)  # [1, 3, 1, H, W]
        encoded = self.vae.encode(pixels).latent_dist.mode().float()
        mean = self.vae.latents_mean.view(1, -1, 1, 1, 1).to(encoded.device, encoded.dtype)
        std = self.vae.latents_std.view(1, -1, 1, 1, 1).to(encoded.device, encoded.dtype)
        frames, h, w = state.cond["video_shape"]
        image_latents = self._pack_video(((encoded - mean) / std).repeat(1, 1, frames, 1, 1))
        mask = encoded.new_zeros(1, 1, frames, h, w)
        mask[:, :, 0] = 1.0
        mask = self._pack_video(mask).squeeze(-1)  # [1, tokens]
        state.latents = image_latents * mask[..., None] + state.latents * (1 - mask[..., None])
        state.cond["conditioning_mask"] = mask

    def _video_timestep(self, state: DenoiseState) -> torch.Tensor:
        return state.timesteps[state.step_index] * (1 - state.cond["conditioning_mask"])

    def _step_video(self, state: DenoiseState, velocity: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        # The step is per element: stepping every token and keeping the image's is diffusers'
        # step over the frames after the first.
        stepped = super()._step_video(state, velocity, t)
        return torch.where(state.cond["conditioning_mask"][..., None] > 0, state.latents, stepped)


def _pack_latents(latents: torch.Tensor, patch_size: int, patch_size_t: int) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, tokens, C * p_t * p * p] (LTX2Pipeline._pack_latents)."""
    from diffusers import LTX2Pipeline

    return LTX2Pipeline._pack_latents(latents, patch_size, patch_size_t)


def _unpack_latents(latents: torch.Tensor, frames: int, height: int, width: int, patch_size: int,
                    patch_size_t: int) -> torch.Tensor:
    from diffusers import LTX2Pipeline

    return LTX2Pipeline._unpack_latents(latents, frames, height, width, patch_size, patch_size_t)
