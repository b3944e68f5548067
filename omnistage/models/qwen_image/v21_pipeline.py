"""Qwen-Image 2.1 text-to-image: a Qwen3-VL encoder, a block-causal single-stream DiT, a 16x VAE.

Reproduces `diffusers.QwenImage21Pipeline` (pipelines/qwenimage21/pipeline_qwenimage21.py)
for text-to-image, on `QwenImage`'s seams (one text-encoder call for every prompt, true
CFG as a second transformer pass per branch, per-request noise schedulers). What 2.1 changes:

- the encoder is Qwen3-VL, read before its final norm (diffusers hooks the norm away, as
  transformers 5 ties `hidden_states[-1]` to the normed output), with the system prompt's
  tokens dropped;
- latents are not patched: one token per latent pixel of the 16x VAE, 64 channels;
- the transformer runs text and image tokens as one causal sequence, so the text prefix's
  keys and values do not depend on the step: the first step of each request and branch
  fills a KV cache ("extract"), later steps compute only the image tokens ("cached"), as
  diffusers does by default (`use_kv_cache=True`);
- CFG is plain (`neg + s * (cond - neg)`), off by default (`true_cfg_scale` 1.0).

Batching prompts of different lengths: the transformer reads the token layout from its
batch's first row, and RoPE places the image after the prompt, so padding a prompt moves
its image. The first step (the KV-cache fill) therefore batches only prompts of one token
length. Later steps batch every length: only the image tokens are queries then, the
prompts are padded to the longest with masked keys, and each request's cached text keys
are turned forward on RoPE's frame axis by what its prompt lacks of the longest
(`_shifted_keys`), so every query-key position difference is the one it has alone.
Condition images (2.1's image-conditioned mode): each is resized to about
`output_resolution` squared pixels at its aspect ratio (RGBA, as the VAE reads four
channels), read by the encoder inside the prompt (placeholders before the instruction, its
alpha composited over white for the vision tower) and VAE-encoded (the mode) into latent
tokens that take the places of its vision tokens in the transformer's sequence, before the
target. They are part of the cached prefix. The output size defaults to the last image's
aspect ratio at that area. A request with condition images runs its cached steps alone (the
key turning above assumes a text-only prefix); its first step batches with requests of the
same prompt length and image sizes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.diffusion.checkpoint import CheckpointConfigs
from omnistage.diffusion.guidance import Guidance, Rows, plain_cfg, scale_if_negative
from omnistage.diffusion.params import ExtraSpec
from omnistage.diffusion.pipeline import (
    DenoiseState,
    DiffusionRequest,
    current_timesteps,
    group_by,
    latent_grid,
    set_flow_match_timesteps,
    split_per_state,
)
from omnistage.core.errors import RequestError
from omnistage.models.qwen_image.pipeline import QwenImage
from omnistage.models.qwen_image.vl_processor import prenorm_last_hidden_states
from omnistage.diffusion.accel.declaration import Accelerations

SYSTEM_PROMPT = "Comprehend and analyze the provided prompt."
# Each slot of the transformer's image mask stands for 2x2 latent tokens.
TOKENS_PER_SLOT = 4


class QwenImage21(QwenImage):
    reference_class: ClassVar[str] = "QwenImage21Pipeline"
    supported_accelerations: ClassVar[Accelerations] = Accelerations(
        cfg_parallel=True, vae_tiling=True, offload=True, quantization=True, compile=True,
        refused={"cache_backend": "its transformer already caches its text prefix across steps",
                 "lora": "diffusers' QwenImage21Pipeline cannot be built over its components (it needs a processor)",
                 "ulysses_degree": "its transformer has no sequence-parallel plan"})
    # QwenImage21Pipeline.__call__ defaults (output_resolution 1024 for the size).
    default_params: ClassVar[dict[str, Any]] = {
        "num_inference_steps": 40,
        "true_cfg_scale": 1.0,
        "height": 1024,
        "width": 1024,
    }
    takes_image: ClassVar[bool] = True  # condition images, optional
    # diffusers' 2.1 pipeline has no max_sequence_length: the prompt is never truncated.
    extras: ClassVar[dict[str, ExtraSpec]] = {
        "output_resolution": ExtraSpec(int, default=1024, min=32, max=4096,
                                       help="Condition images are resized to about this side squared in pixels "
                                            "(and the output, when no size is asked for)."),
    }

    prompt_template: ClassVar[str] = (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{{}}<|im_end|>\n<|im_start|>assistant\n"
    )
    # The step caches hook dual-stream blocks; 2.1's single-stream blocks with a KV-cached
    # prefix have no chain here yet, so cache_backend is refused for it.
    step_cache_blocks: ClassVar[Any] = None

    # The checkpoint's `processor` is a Qwen3VLProcessor, which transformers only builds with
    # torchvision installed; diffusers' pipeline needs one to be constructed, and only its
    # tokenizer and image halves are used.
    @classmethod
    def loader_kwargs(cls, path: str) -> dict[str, Any]:
        from transformers import Qwen3VLProcessor

        from omnistage.models.qwen_image.vl_processor import processor_from_parts

        return {"processor": processor_from_parts(Qwen3VLProcessor, path)}

    @classmethod
    def from_diffusers(cls, pipe: Any, path: str, configs: CheckpointConfigs, device: torch.device | str,
                       dtype: torch.dtype) -> "QwenImage21":
        return cls({**pipe.components, "tokenizer": pipe.processor.tokenizer}, device, dtype, configs)

    def __init__(self, components: dict[str, Any], device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, configs: CheckpointConfigs | None = None):
        from diffusers.image_processor import VaeImageProcessor

        super().__init__(components, device, dtype, configs)
        self.image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor,
                                                 vae_latent_channels=self.latent_channels)
        # The system turn's tokens, dropped from the encoder's output (diffusers' _drop_idx).
        system_turn = self.prompt_template.split("<|im_start|>user")[0]
        self.prompt_template_start_idx = len(self.tokenizer(system_turn).input_ids)

    def configure(self, configs: CheckpointConfigs) -> None:
        self.vae_scale_factor = configs.vae.get("scale_factor_spatial") or 16
        # The transformer's image slots cover 2x2 latent tokens: sizes divide by twice the factor.
        self.multiple_of = self.vae_scale_factor * 2
        self.latent_channels = configs.vae.get("z_dim", 64)
        self.guidance_embeds = False
        # A checkpoint may fix its own sigma schedule (model_index.json sample_sigmas).
        self.sample_sigmas = configs.pipeline.get("sample_sigmas")
        self.default_params = dict(type(self).default_params)
        if self.sample_sigmas:
            self.default_params["num_inference_steps"] = len(self.sample_sigmas)

    def check_inputs(self, request: DiffusionRequest) -> None:
        super().check_inputs(request)
        steps = request.params.num_inference_steps
        if self.sample_sigmas and steps != len(self.sample_sigmas):
            raise RequestError("num_inference_steps", f"num_inference_steps: this checkpoint samples on its own {len(self.sample_sigmas)}-"
                               f"step schedule (model_index.json sample_sigmas), got {steps}")

    def prepare_request(self, request: DiffusionRequest) -> DiffusionRequest:
        # A size left unset follows output_resolution (and the last condition image's aspect
        # ratio), floored to the size multiple, as diffusers computes it.
        from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

        unset = [name for name in ("height", "width")
                 if getattr(request.params, name) is None and name not in self.deploy_defaults]
        request = super().prepare_request(request)
        if unset:
            side = request.params.extras["output_resolution"]
            width, height = side, side
            if request.images:
                image = request.images[-1]
                width, height, _ = calculate_dimensions(side * side, image.size[0] / image.size[1])
            size = {"height": height // self.multiple_of * self.multiple_of,
                    "width": width // self.multiple_of * self.multiple_of}
            request = dataclasses.replace(request, params=request.params.model_copy(
                update={name: size[name] for name in unset}))
            self.check_inputs(request)
        return request

    # -- 2. encode --------------------------------------------------------------------------

    @torch.no_grad()
    def encode(self, requests: list[DiffusionRequest]) -> list[DenoiseState]:
        # Text-to-image requests share one encoder call (QwenImage.encode); a request with
        # condition images is encoded alone, its images with each prompt.
        plain = [r for r in requests if not r.images]
        states = dict(zip(map(id, plain), super().encode(plain) if plain else []))
        for request in requests:
            if request.images:
                states[id(request)] = self._condition_state(request)
        return [states[id(r)] for r in requests]

    def _condition_state(self, request: DiffusionRequest) -> DenoiseState:
        from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_dimensions

        side = request.params.extras["output_resolution"]
        originals = [image.convert("RGBA") for image in request.images]
        sizes = [calculate_dimensions(side * side, image.size[0] / image.size[1])[:2] for image in originals]
        images = [self.image_processor.resize(image, width=w, height=h) for image, (w, h) in zip(originals, sizes)]
        prompt, prompt_mask = self._encode_with_images(request.prompt, images)
        negative, negative_mask = (self._encode_with_images(request.params.negative_prompt, images)
                                   if self._uses_cfg(request) else (None, None))
        state = self._initial_state(request, None, prompt, negative)
        latents, shapes = [], []
        for image, (width, height) in zip(originals, sizes):  # resized from the original, as diffusers does
            pixels = self.image_processor.preprocess(image, width=width, height=height).unsqueeze(2)
            encoded = self.vae.encode(pixels.to(self.device, self.vae.dtype)).latent_dist.mode()
            mean, std = self._latents_stats(encoded)
            encoded = ((encoded - mean) / std).to(prompt.dtype)
            latents.append(encoded.flatten(2).transpose(1, 2))  # [1, h * w, C]: unpatched tokens
            shapes.append((1, encoded.shape[-2], encoded.shape[-1]))
        n = state.latents.shape[0]
        state.cond.update(condition_latents=torch.cat(latents, dim=1).expand(n, -1, -1),
                          img_shapes=(*shapes, *state.cond["img_shapes"]),
                          prompt_pad_mask=prompt_mask, negative_prompt_pad_mask=negative_mask)
        return state

    def _encode_with_images(self, prompt: str, images: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """([L, D] embeddings, [L] mask of the condition images' vision tokens) of `prompt` read
        with `images`, the system turn dropped."""
        from PIL import Image

        placeholders = " ".join(f"<image{i}><|vision_start|><|image_pad|><|vision_end|>"
                                for i in range(1, len(images) + 1))
        text = self.prompt_template.replace("<|im_start|>user\n", f"<|im_start|>user\n{placeholders}")
        flat = []
        for image in images:  # the alpha composited over white for the vision tower only, as trained
            white = Image.new("RGB", image.size, (255, 255, 255))
            white.paste(image, mask=image.getchannel("A"))
            flat.append(white)
        inputs = self.processor(text=[text.format(prompt or " ")], images=flat, padding=True,
                                return_tensors="pt").to(self.device)
        hidden = prenorm_last_hidden_states(self.text_encoder, dict(inputs))[0]
        image_token = self.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        start = self.prompt_template_start_idx
        return hidden[start:], (inputs["input_ids"][0] == image_token)[start:]

    def _templated(self, prompt: str, image: Any) -> str:
        return self.prompt_template.format(prompt or " ")  # Qwen has no bos: an empty prompt reads nothing

    def _text_inputs(self, texts: list[str], images: list[Any]) -> dict[str, torch.Tensor]:
        # Right padding: without images Qwen3-VL numbers positions 0.. whatever the mask, so a
        # prompt padded on the right sees the positions it has alone (diffusers pads on the
        # left, but encodes one prompt at a time here).
        tokens = self.tokenizer(texts, padding=True, padding_side="right", return_tensors="pt").to(self.device)
        return {"input_ids": tokens.input_ids, "attention_mask": tokens.attention_mask,
                "mm_token_type_ids": torch.zeros_like(tokens.input_ids)}

    def _encoder_hidden_states(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return prenorm_last_hidden_states(self.text_encoder, inputs)

    def _truncate(self, embeds: torch.Tensor, request: DiffusionRequest) -> torch.Tensor:
        return embeds  # no max_sequence_length (see `extras`)

    def _initial_state(self, request: DiffusionRequest, image: Any, prompt_embeds: torch.Tensor,
                       negative_embeds: torch.Tensor | None) -> DenoiseState:
        from diffusers.utils.torch_utils import randn_tensor

        params = request.params
        n = params.num_outputs_per_prompt
        latent_h, latent_w = latent_grid(params, self.multiple_of)
        channels = self.transformer.config.in_channels
        # Same draw as diffusers' [n, 1 frame, C, h, w] noise, flattened to [n, h * w, C].
        noise = randn_tensor((n, 1, channels, latent_h, latent_w), generator=self.generator_for(request),
                             device=self.device, dtype=prompt_embeds.dtype)
        latents = noise.view(n, channels, latent_h * latent_w).transpose(1, 2)

        noise_scheduler = self.noise_scheduler_copy()
        num_steps = params.num_inference_steps
        sigmas = self.sample_sigmas or np.linspace(1.0, 1 / num_steps, num_steps)
        timesteps = set_flow_match_timesteps(noise_scheduler, sigmas, latents.shape[1], self.device)
        return DenoiseState(
            request=request,
            latents=latents,
            noise_scheduler=noise_scheduler,
            timesteps=timesteps,
            cond={
                "prompt_embeds": prompt_embeds,
                "negative_prompt_embeds": negative_embeds,
                "true_cfg_scale": params.true_cfg_scale,
                "latent_size": (latent_h, latent_w),
                "img_shapes": ((1, latent_h, latent_w),),
                # Each branch's prefix keys and values, filled by its first transformer call.
                "kv_cache": {"cond": None, "uncond": None},
            },
        )

    # -- 3. denoise -----------------------------------------------------------------------

    guidance: ClassVar[Guidance] = Guidance(scale=scale_if_negative("true_cfg_scale"), combine=plain_cfg)

    def _predict(self, rows: Rows) -> list[torch.Tensor]:
        """One branch's rows: one transformer call for the rows that decode from their KV caches,
        one per prompt length for those that fill theirs."""
        branch = rows[0][1]
        embeds_key = "prompt_embeds" if branch == "cond" else "negative_prompt_embeds"
        states = [s for s, _ in rows]
        preds: dict[int, torch.Tensor] = {}
        def key(s: DenoiseState) -> Any:
            if s.cond["kv_cache"][branch] is None:
                return s.cond[embeds_key].shape[0]
            return id(s) if "condition_latents" in s.cond else "cached"  # see the module note

        for group in group_by(states, key):
            preds.update(zip(map(id, group), self._predict_group(group, branch, embeds_key)))
        return [preds[id(s)] for s in states]

    def _predict_group(self, states: list[DenoiseState], branch: str, embeds_key: str) -> list[torch.Tensor]:
        from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

        latents = torch.cat([s.latents for s in states])
        embeds, mask = self._pad_embeds([s.cond[embeds_key] for s in states for _ in range(s.latents.shape[0])])
        slots = torch.ones(latents.shape[0], embeds.shape[1] + latents.shape[1] // TOKENS_PER_SLOT, dtype=torch.bool,
                           device=self.device)
        slots[:, : embeds.shape[1]] = False  # text positions; the image's slots follow the prompt
        hidden_states = latents
        if "condition_latents" in states[0].cond:  # the condition images' tokens fill their vision slots
            slots[:, : embeds.shape[1]] = states[0].cond[embeds_key.replace("embeds", "pad_mask")]
            hidden_states = torch.cat([torch.cat([s.cond["condition_latents"], s.latents], dim=1) for s in states])
        num_blocks = len(self.transformer.transformer_blocks)
        extract = states[0].cond["kv_cache"][branch] is None
        if extract:
            cache = QwenImage21KVCache(num_blocks)
        else:
            cache = _joined_cache(states, branch, num_blocks, embeds.shape[1], self.transformer.pos_embed.freqs[0])
        with self.transformer.cache_context(branch):
            noise_pred = self.transformer(
                hidden_states=hidden_states,
                timestep=current_timesteps(states).to(latents.dtype) / 1000,
                encoder_hidden_states=embeds,
                encoder_hidden_states_mask=mask,
                img_shapes=[list(states[0].cond["img_shapes"])] * latents.shape[0],
                img_mask=slots,
                kv_cache=cache,
                kv_cache_mode="extract" if extract else "cached",
                return_dict=False,
            )[0]
        if extract:
            _split_cache(cache, states, branch)
        return split_per_state(noise_pred[:, -latents.shape[1]:], states)

    # -- 4. decode ------------------------------------------------------------------------

    def _decode_group(self, states: list[DenoiseState]) -> list[np.ndarray]:
        latent_h, latent_w = states[0].cond["latent_size"]
        latents = torch.cat([s.latents for s in states])
        latents = latents.transpose(1, 2).reshape(latents.shape[0], -1, 1, latent_h, latent_w).to(self.vae.dtype)
        mean, std = self._latents_stats(latents)
        images = self.vae_decode(latents * std + mean)[:, :, 0]
        return split_per_state(self.image_processor.postprocess(images, output_type="np"), states)


def _joined_cache(states: list[DenoiseState], branch: str, num_blocks: int, length: int,
                  frame_freqs: torch.Tensor) -> Any:
    """One KV cache over `states`' rows for `branch`, each state's prefix padded to `length`
    tokens (the padding is masked) and its keys moved to where that prefix would end at
    `length` (`_shifted_keys`); `frame_freqs` is the transformer's RoPE table of the frame axis."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    if len(states) == 1:
        return states[0].cond["kv_cache"][branch]
    joined = QwenImage21KVCache(num_blocks)
    for i, layer in enumerate(joined.layer_caches):
        keys, values = [], []
        for state in states:
            k, v = state.cond["kv_cache"][branch].get_layer(i).get()
            pad = length - k.shape[1]
            keys.append(_pad_tokens(_shifted_keys(k, frame_freqs[pad]) if pad else k, pad))
            values.append(_pad_tokens(v, pad))
        layer.store(torch.cat(keys), torch.cat(values))
    return joined


def _shifted_keys(keys: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """`keys` [B, S, heads, head_dim] (after RoPE) moved forward on RoPE's frame axis: its first
    complex pairs are multiplied by `rotation` (the frame table's row for the shift), as
    `apply_rotary_emb_qwen` applies positions. Text keys sit at equal positions on all three
    axes; only the frame axis is where the image (a constant frame, its own height and width
    grid) sits relative to them, so only it moves with the prompt's end."""
    pairs = torch.view_as_complex(keys.float().reshape(*keys.shape[:-1], -1, 2))
    n = rotation.shape[0]
    pairs = torch.cat([pairs[..., :n] * rotation.to(pairs.device), pairs[..., n:]], dim=-1)
    return torch.view_as_real(pairs).flatten(3).type_as(keys)


def _pad_tokens(x: torch.Tensor, pad: int) -> torch.Tensor:
    """`x` [B, S, ...] with `pad` zero tokens appended."""
    return torch.cat([x, x.new_zeros(x.shape[0], pad, *x.shape[2:])], dim=1) if pad else x


def _split_cache(cache: Any, states: list[DenoiseState], branch: str) -> None:
    """Give each state its own rows of a KV cache a batched "extract" call filled."""
    from diffusers.models.transformers.transformer_qwenimage21 import QwenImage21KVCache

    if len(states) == 1:
        states[0].cond["kv_cache"][branch] = cache
        return
    offset = 0
    for state in states:
        rows = slice(offset, offset + state.latents.shape[0])
        own = QwenImage21KVCache(len(cache.layer_caches))
        for layer, source in zip(own.layer_caches, cache.layer_caches):
            k, v = source.get()
            layer.store(k[rows], v[rows])
        state.cond["kv_cache"][branch] = own
        offset = rows.stop
