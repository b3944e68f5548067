"""Kandinsky 6 TI2VA: text or image -> video with its soundtrack, one multimodal DiT denoising
the video and audio latents together.

Reproduces `diffusers.Kandinsky6TI2VAPipeline` (pipelines/kandinsky6/pipeline_kandinsky6_ti2va.py),
split at the encode / denoise_step / decode seams:

- encode: Qwen2.5-VL's last hidden states of the prompt in Kandinsky's chat template (its first
  129 template tokens cropped, as diffusers does) and CLIP's pooled embedding; the negative
  prompt defaults to Kandinsky's. With an image, its VAE latent (sampled from the request's
  generator first, as diffusers does) is appended as an extra frame with token type 1 that
  reuses the first frame's rotary position. Then the video noise and the audio noise.
- denoise_step: one transformer call per branch predicts both velocities; CFG combines each
  (uncond + s * (cond - uncond)); a video and an audio noise scheduler step them. The
  transformer's input carries two conditioning channels: zeros and a mask (1 on the image frame).
- decode: the HunyuanVideo VAE decodes the video (the image frame dropped); the MMAudio VAE
  decodes the audio latents to a mel spectrogram and the vocoder to a mono waveform, carried
  on the VideoPayload so the MP4 gets an audio track.

Not served: diffusers' prompt expansion (`expand_prompts`, a Qwen generate call) and
`sample_audio=False`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.core.errors import RequestError
from omnistage.diffusion.accel.declaration import Accelerations
from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionPipelineBase,
    DiffusionRequest,
    check_divisible,
    check_video_frames,
    encode_prompts_by_length,
    group_by,
    map_groups,
)


def _guidance_scale(state: DenoiseState) -> float | None:
    return None if state.cond["negative"] is None else state.cond["guidance_scale"]


def _av_cfg(state: DenoiseState, cond: tuple, uncond: tuple, scale: float) -> tuple:
    """diffusers' CFG on the video and on the audio prediction."""
    return tuple(plain_cfg(state, c, u, scale) for c, u in zip(cond, uncond))


class Kandinsky6TI2VA(DiffusionPipelineBase):
    reference_class: ClassVar[str] = "Kandinsky6TI2VAPipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        vae_tiling=True, offload=True, quantization=True,
        refused={"cfg_parallel_size": "its two branches predict video and audio together",
                 "cache_backend": "its fused audio-video blocks have no cache hook",
                 "lora": "diffusers' Kandinsky6TI2VAPipeline has no LoRA loader",
                 "compile": "not measured on its fused blocks yet"})
    output_modality: ClassVar[str] = "video"
    takes_image: ClassVar[bool] = True  # one optional first-frame image (text-to-video without)
    model_cpu_offload_seq: ClassVar[str] = "text_encoder->text_encoder_2->transformer->vae->audio_vae->vocoder"
    # Kandinsky6TI2VAPipeline.__call__ defaults (fps is its frame_rate).
    default_params: ClassVar[dict[str, Any]] = {
        "height": 512,
        "width": 768,
        "num_frames": 121,
        "fps": 24.0,
        "num_inference_steps": 50,
        "guidance_scale": 5.0,
    }
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "max_sequence_length": ExtraSpec(int, default=1024, min=1, max_from=("tokenizer", "text_encoder"),
                                         help="Qwen prompt tokens after the chat template (padded to this)."),
    }
    guidance: ClassVar[Guidance] = Guidance(scale=_guidance_scale, combine=_av_cfg)

    @classmethod
    def loader_kwargs(cls, path: str) -> dict[str, Any]:
        # The `tokenizer` is a Qwen2_5_VLProcessor, which transformers builds only with
        # torchvision; its text half is all the pipeline uses.
        from transformers import Qwen2_5_VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        return {**cls.loader_overrides, "tokenizer": processor_from_parts(Qwen2_5_VLProcessor, path, "tokenizer")}

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.video_processor import VideoProcessor

        super().__init__(components, device, dtype, configs)
        self.video_processor = VideoProcessor(vae_scale_factor=self.vae_spatial_ratio)

    def configure(self, configs: CheckpointConfigs) -> None:
        vae, transformer = configs.vae, configs.transformer
        self.vae_spatial_ratio = vae.get("spatial_compression_ratio", 8)
        self.vae_temporal_ratio = vae.get("temporal_compression_ratio", 4)
        self.patch_size = tuple(transformer.get("patch_size", (1, 2, 2)))
        # An image is an extra frame: the transformer needs the conditioning channels and token types.
        self.takes_reference = bool(transformer.get("visual_cond", True)) and \
            transformer.get("visual_token_type_num_embeddings", 0) >= 2

    # -- 1. check inputs ----------------------------------------------------------------

    def check_inputs(self, request: DiffusionRequest) -> None:
        import PIL.Image

        super().check_inputs(request)
        params = request.params
        multiple = self.vae_spatial_ratio * max(self.patch_size[1:])
        check_divisible(params, height=multiple, width=multiple)
        check_video_frames(params, self.vae_temporal_ratio)
        for name in ("true_cfg_scale", "guidance_scale_2"):
            if getattr(params, name) is not None:
                raise RequestError(name, f"{name}: not used by Kandinsky 6 (its CFG scale is guidance_scale)")
        if len(request.images) > 1:
            raise RequestError("image", f"image: at most one first-frame image, got {len(request.images)}")
        if request.images:
            if not isinstance(request.images[0], PIL.Image.Image):
                raise RequestError("image", f"image: must be a PIL image, got {type(request.images[0]).__name__}")
            if not self.takes_reference:
                raise RequestError("image", "image: this checkpoint's transformer takes no image (no visual_cond "
                                            "or token types)")

    # -- 2. encode: prompts, image, noise, noise schedulers -------------------------------

    def _encode_texts(self, texts: list[str], max_sequence_length: int) -> list[dict[str, torch.Tensor]]:
        """Per text its Qwen token states [1, L, D], padding mask [1, L] and CLIP pooled embedding
        [1, D2] (Kandinsky6TI2VAPipeline._get_prompt_embeds)."""
        from diffusers.pipelines.kandinsky6.pipeline_kandinsky6_ti2va import (
            _CLIP_MAX_LENGTH,
            _PROMPT_TEMPLATE,
            _QWEN_CROP_START,
        )

        inputs = self.tokenizer(text=[_PROMPT_TEMPLATE.format(t) for t in texts], images=None, videos=None,
                                max_length=max_sequence_length + _QWEN_CROP_START, truncation=True,
                                return_tensors="pt", padding="max_length").to(self.device)
        hidden = self.text_encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                                   return_dict=True, output_hidden_states=True)["hidden_states"][-1]
        embeds = hidden[:, _QWEN_CROP_START:].to(self.transformer.dtype)
        mask = inputs["attention_mask"][:, _QWEN_CROP_START:].to(torch.bool)
        clip = self.tokenizer_2(texts, max_length=_CLIP_MAX_LENGTH, truncation=True, add_special_tokens=True,
                                padding="max_length", return_tensors="pt").to(self.device)
        pooled = self.text_encoder_2(**clip)["pooler_output"].to(self.transformer.dtype)
        return [{"embeds": e, "mask": m, "pooled": p}
                for e, m, p in zip(embeds.split(1), mask.split(1), pooled.split(1))]

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        from diffusers import Kandinsky6TI2VAPipeline

        # Requests with the same max_sequence_length share one call of each encoder; diffusers'
        # default negative prompt stands in for a missing or empty one.
        embeds = encode_prompts_by_length(requests, uses_cfg=lambda r: r.params.guidance_scale > 1.0,
                                          encode=self._encode_texts,
                                          default_negative=Kandinsky6TI2VAPipeline._DEFAULT_NEGATIVE_PROMPT)
        return [self._initial_state(r, prompt, negative) for r, (prompt, negative) in zip(requests, embeds)]

    def _initial_state(self, request: DiffusionRequest, prompt: dict, negative: dict | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        generator = self.generator_for(request)
        dtype = self.transformer.dtype
        # 1. The image's latent first: diffusers samples it from the generator before any noise.
        first_frame = self._encode_image(request, generator) if request.images else None
        # 2. Video noise [1, T, H, W, C], then audio noise [1, L, C].
        frames = (params.num_frames - 1) // self.vae_temporal_ratio + 1
        h, w = params.height // self.vae_spatial_ratio, params.width // self.vae_spatial_ratio
        latents = randn_tensor((1, frames, h, w, self.transformer.config.in_visual_dim), generator=generator,
                               device=self.device, dtype=dtype)
        audio_length = math.ceil(((frames - 1) * self.vae_temporal_ratio + 1) / params.fps
                                 * self.audio_vae.config.sample_rate / self.audio_vae.latent_hop_length)
        audio = randn_tensor((1, audio_length, self.transformer.config.in_audio_dim), generator=generator,
                             device=self.device, dtype=dtype)
        # 3. One noise scheduler per modality (the audio's keeps its own step counter).
        noise_schedulers = []
        for _ in range(2):
            noise_scheduler = self.noise_scheduler_copy()
            noise_scheduler.set_timesteps(params.num_inference_steps, device=self.device)
            noise_schedulers.append(noise_scheduler)
        cond = {"prompt": prompt, "negative": negative, "guidance_scale": params.guidance_scale,
                "audio_latents": audio, "audio_noise_scheduler": noise_schedulers[1], "first_frame": first_frame,
                "video_frames": frames}
        if first_frame is not None:
            # The image frame reuses the first frame's rotary position and carries token type 1.
            latents = torch.cat([latents, first_frame[:, None]], dim=1)
            cond["token_types"] = torch.zeros((1, frames + 1), dtype=torch.long, device=self.device)
            cond["token_types"][:, -1] = 1
        return DenoiseState(request=request, latents=latents, noise_scheduler=noise_schedulers[0],
                            timesteps=noise_schedulers[0].timesteps, cond=cond)

    def _encode_image(self, request: DiffusionRequest, generator: torch.Generator) -> torch.Tensor:
        """The image's VAE latent [1, h, w, C] sampled from `generator`, scaled
        (Kandinsky6TI2VAPipeline.encode_image; a PIL image is resized and center-cropped)."""
        params = request.params
        image = self.video_processor.preprocess(request.images[0], height=params.height, width=params.width,
                                                resize_mode="crop")
        image = image.to(self.device, self.vae.dtype).unsqueeze(2)
        latents = self.vae.encode(image).latent_dist.sample(generator) * self.vae.config.scaling_factor
        return latents[:, :, 0].permute(0, 2, 3, 1).to(self.transformer.dtype)

    # -- 3. denoise -----------------------------------------------------------------------

    @torch.no_grad()
    def denoise_step(self, states: list[DenoiseState]) -> None:
        # One call needs equal video and audio grids, prompt lengths and image conditioning.
        def key(s: DenoiseState) -> tuple:
            return (tuple(s.latents.shape), tuple(s.cond["audio_latents"].shape), s.cond["prompt"]["embeds"].shape[1],
                    s.cond["first_frame"] is not None)

        for group in group_by(states, key):
            for s in group:
                if s.cond["first_frame"] is not None:  # the image frame is clean at every step
                    s.latents[:, -1] = s.cond["first_frame"]
            for s, (video_v, audio_v) in zip(group, self.guided_predictions(group, self._predict)):
                t = s.timesteps[s.step_index]
                s.latents = s.noise_scheduler.step(video_v, t, s.latents, return_dict=False)[0]
                audio = s.cond["audio_latents"]
                s.cond["audio_latents"] = s.cond["audio_noise_scheduler"].step(audio_v, t, audio, return_dict=False)[0]
                s.step_index += 1

    def _predict(self, rows: Rows) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One transformer call over `rows` -> per row its (video, audio) velocity."""
        states = [s for s, _ in rows]
        prompts = [s.cond["prompt" if branch == "cond" else "negative"] for s, branch in rows]
        latents = torch.cat([s.latents for s in states])
        model_input = latents
        if self.transformer.config.visual_cond:
            # [latent | conditioning latent (always zero) | mask (1 on the image frame)].
            mask = torch.zeros((*latents.shape[:-1], 1), dtype=latents.dtype, device=latents.device)
            if states[0].cond["first_frame"] is not None:
                mask[:, -1] = 1
            model_input = torch.cat([latents, torch.zeros_like(latents), mask], dim=-1)
        rope_pos = token_types = None
        if states[0].cond["first_frame"] is not None:
            p_t, p_h, p_w = self.patch_size
            frames = states[0].cond["video_frames"]
            rope_pos = (torch.cat([torch.arange(frames // p_t, device=self.device),
                                   torch.zeros(1, dtype=torch.long, device=self.device)]),
                        torch.arange(latents.shape[2] // p_h, device=self.device),
                        torch.arange(latents.shape[3] // p_w, device=self.device))
            token_types = torch.cat([s.cond["token_types"] for s in states])
        masks = [p["mask"] for p in prompts]
        # A prompt without padding needs no mask: diffusers passes none when no row is padded.
        mask = None if all(m.all() for m in masks) else torch.cat(masks)
        video, audio = self.transformer(
            hidden_states=model_input,
            audio_hidden_states=torch.cat([s.cond["audio_latents"] for s in states]),
            encoder_hidden_states=torch.cat([p["embeds"] for p in prompts]),
            pooled_projections=torch.cat([p["pooled"] for p in prompts]),
            timestep=torch.cat([s.timesteps[s.step_index].expand(1) for s in states]),
            visual_rope_pos=rope_pos,
            encoder_attention_mask=mask,
            visual_token_type_ids=token_types,
            return_dict=False,
        )
        return list(zip(video.split(1), audio.split(1)))

    # -- 4. decode ------------------------------------------------------------------------

    @torch.no_grad()
    def decode_av(self, states: list[DenoiseState]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per state, (video [F, H, W, 3] floats in [0, 1], audio [1, samples] mono floats)."""
        videos = self.decode_arrays(states)
        audios = map_groups(states, lambda s: tuple(s.cond["audio_latents"].shape), self._decode_audios)
        return list(zip(videos, audios))

    @torch.no_grad()
    def decode_arrays(self, states: list[DenoiseState]) -> list[np.ndarray]:
        return map_groups(states, lambda s: (s.cond["video_frames"], *s.latents.shape[2:]), self._decode_videos)

    @torch.no_grad()
    def decode(self, states: list[DenoiseState]) -> list[Any]:
        sample_rate = int(self.audio_vae.config.sample_rate)
        return [self.to_av_payload(video, audio, state.request, sample_rate)
                for state, (video, audio) in zip(states, self.decode_av(states))]

    def _decode_videos(self, states: list[DenoiseState]) -> list[np.ndarray]:
        # The image frame (if any) is dropped; [B, T, H, W, C] -> [B, C, T, H, W].
        latents = torch.cat([s.latents[:, : s.cond["video_frames"]] for s in states]).permute(0, 4, 1, 2, 3)
        video = self.vae_decode(latents.to(self.vae.dtype) / self.vae.config.scaling_factor)
        return list(self.video_processor.postprocess_video(video, output_type="np"))

    def _decode_audios(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latents = torch.cat([s.cond["audio_latents"] for s in states]).permute(0, 2, 1)
        mel = self.audio_vae.decode(latents.to(self.audio_vae.dtype) / self.audio_vae.config.scaling_factor,
                                    return_dict=False)[0]
        waveform = self.vocoder(mel.to(self.vocoder.dtype), return_dict=False)[0][:, 0].float()  # [B, samples]
        return [w[None].cpu().numpy() for w in waveform]
