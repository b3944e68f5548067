"""Qwen2.5-Omni thinker as an AR stage: text, audio and images in, text out, plus what the talker needs.

Wraps `Qwen2_5OmniThinkerForConditionalGeneration` without patching it: the engine's
masks and paged KV cache go into its language model through the public `attention_mask`
mapping and `cache=` arguments, as in `HFCausalLM`.

Per request (`ThinkerState`), prepared once at admission:
- M-RoPE positions of the prompt `[3, L]` and the decode offset (`rope_delta`), from the
  model's own `get_rope_index` (plain `arange` for text; audio spans follow TMRoPE);
- audio features: each `<|AUDIO|>` of the chat template is expanded to as many tokens
  as the audio encoder makes of that clip (as `Qwen2_5OmniProcessor` does), and the
  encoder's outputs are scattered into those positions at prefill;
- images: the same for `<|IMAGE|>` and the vision encoder, the pixels prepared by the
  checkpoint's image processor on its PIL/numpy path (`Qwen2VLImageProcessorPil`, no
  torchvision), one `<|IMAGE|>` per merged patch (`grid_thw.prod() / merge_size**2`);
  video parts are refused: transformers 5's video processors need torchvision;
- when a talker is downstream (the request asks for hidden states), the thinker-vocab
  embeddings the talker reads besides the reply: the voice's text-BOS, tts_text_eos and
  tts_text_pad. They are in every output's `extras["talker_embeds"]` (`[3, H]`), next to
  `mrope_positions` and `rope_delta`.

`input_embeds` are the token embeddings with the audio and image positions zeroed, which
is what the reference `generate()` hands the talker (`masked_scatter_` with zeros).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.hf_model import eos_token_ids, load_tokenizer
from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.qwen2_5_omni.encoder_cache import EncoderCache
from omnistage.models.qwen2_5_omni.media import OmniMedia, prompt_options
from omnistage.models.chat_media import chat_media
from omnistage.models.qwen2_5_omni.processors import DEFAULT_VOICE
from omnistage.models.qwen2_5_omni.video import VideoRules, interleave_in_chunks
from omnistage.models.qwen2_5_omni.weights import check_voice, load_speakers, load_thinker



@dataclass
class ThinkerState:
    mrope_positions: torch.Tensor
    """[3, L] long: the prompt's M-RoPE positions."""
    rope_delta: int
    """Decode position = sequence position + rope_delta."""
    media: dict[int, torch.Tensor] | None = None
    """Placeholder id (<|AUDIO|>, <|IMAGE|>, <|VIDEO|>) -> [its tokens, H] encoder outputs, in
    prompt order; dropped after prefill."""
    talker_embeds: torch.Tensor | None = None
    """[3, H]: embeddings of the voice's text-BOS, tts_text_eos, tts_text_pad."""


class OmniThinker(OmniMedia, ARModel):
    # Qwen2_5OmniProcessor's audio settings: every clip padded to the feature extractor's length.
    audio_feature_kwargs = {"padding": "max_length"}

    # Text prompts are token ids with M-RoPE positions known per position, so they chunk,
    # hit the prefix cache and recompute; prompts with audio are prefilled whole (below).
    supports_chunked_prefill = True
    supports_prepacked_linears = True  # transformers' towers and layers only call their linears

    def __init__(self, model, tokenizer, feature_extractor, speakers: dict, talker_text_ids: tuple[int, int],
                 eos: tuple[int, ...], device: torch.device, image_processor=None) -> None:
        text_config = model.config.text_config
        if set(text_config.layer_types) != {"full_attention"}:
            raise ValueError("the thinker supports full attention layers only, not "
                             f"{sorted(set(text_config.layer_types))}")
        self.model = model
        self.lm = model.model.language_model
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.encoder_cache = EncoderCache()  # vision outputs by image digest, across requests
        self.speakers = speakers
        self.talker_text_ids = talker_text_ids  # (tts_text_eos, tts_text_pad), thinker-vocab ids
        self.eos_token_ids = eos
        self.device = device
        self.num_layers = text_config.num_hidden_layers
        self.kv_dims = kv_dims(text_config)
        self.max_position_embeddings = text_config.max_position_embeddings
        self.audio_token_id = model.config.audio_token_index
        self.image_token_id = model.config.image_token_index
        self.video_token_id = model.config.video_token_index
        self.audio_bos_id, self.audio_eos_id = model.config.audio_start_token_id, model.config.audio_end_token_id
        # Qwen2_5OmniProcessor's video defaults: 2 fps, frame size bounds, its token layout's time units.
        self.video_rules = VideoRules(fps=2.0, min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28,
                                      position_id_per_seconds=25, seconds_per_chunk=2.0)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> OmniThinker:
        from transformers import Qwen2_5OmniConfig, WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        model = load_thinker(model_path, device, dtype)
        talker_config = Qwen2_5OmniConfig.from_pretrained(model_path).talker_config
        try:
            features = WhisperFeatureExtractor.from_pretrained(model_path)
        except OSError:
            features = None  # text-only checkpoint folder: audio input is refused at admission
        images = image_processor(model_path, Qwen2VLImageProcessorPil)
        return cls(model, load_tokenizer(model_path), features, load_speakers(model_path),
                   (talker_config.tts_text_end_token_id, talker_config.tts_text_pad_token_id),
                   eos_token_ids(model_path, model.config), device, images)

    # --- admission -----------------------------------------------------------------------------

    def build_prompt(self, inputs: Any) -> PromptInputs:
        """The generic inputs (see `ARModel.build_prompt`), plus `voice` when a talker is downstream
        and `use_audio_in_video` (a video's own audio is heard with it, interleaved in time).

        Chat messages may hold audio parts `{"type": "audio", "audio": float array, "sample_rate": int}`,
        image parts `{"type": "image", "image": PIL image or uint8 [H, W, 3] array}` and video parts
        (see `qwen2_5_omni.video`).
        """
        inputs, voice, with_audio = prompt_options(inputs, DEFAULT_VOICE)
        if voice is not None:
            check_voice(self.speakers, voice)
        media = chat_media(inputs)
        ids = super().build_prompt(inputs).token_ids
        with torch.inference_mode():
            prompt = self._encode_media(ids, media, with_audio)
            ids_t = torch.tensor([prompt.ids], device=self.device)
            positions, delta = self.model.get_rope_index(
                ids_t, prompt.image_grid, prompt.video_grid, torch.ones_like(ids_t), with_audio,
                prompt.audio_seqlens, prompt.seconds_per_grid)
            talker_embeds = None
            if voice is not None:
                special = [self.speakers[voice]["bos_token"], *self.talker_text_ids]
                talker_embeds = self.lm.embed_tokens(torch.tensor(special, device=self.device))
        state = ThinkerState(positions[:, 0], int(delta.item()), media=prompt.embeds or None,
                             talker_embeds=talker_embeds)
        return PromptInputs(prompt.ids, state, cache_ids=prompt.cache_ids if prompt.embeds else None)

    def is_token_reproducible(self, prompt: PromptInputs) -> bool:
        # A media placeholder id is the same for every clip, image and video: its keys follow
        # from the media, not the ids, so such prompts are never recomputed from ids, and are
        # shared only under `cache_ids`, which name the media.
        return prompt.model_state.media is None

    def _interleave(self, times, num_audio: int) -> list[str]:
        return interleave_in_chunks(times, num_audio, self.video_rules)

    @staticmethod
    def _audio_token_counts(seqlens: torch.Tensor) -> list[int]:
        from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import _get_feat_extract_output_lengths

        return _get_feat_extract_output_lengths(seqlens).tolist()

    # --- the forward ---------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        embeds = self.lm.embed_tokens(batch.input_ids)
        talker_embeds = embeds
        if batch.is_prefill:
            embeds, talker_embeds = self._merge_media(batch, embeds)
        out = self.lm(inputs_embeds=embeds, position_ids=self._positions(batch),
                      attention_mask={"full_attention": sdpa_mask(batch)}, cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        states = [s.model_state for s in batch.seqs]
        extras = [{"talker_embeds": st.talker_embeds, "mrope_positions": st.mrope_positions,
                   "rope_delta": st.rope_delta} if st.talker_embeds is not None else {} for st in states]
        return ModelOutput(
            logits=self.model.lm_head(last),
            hidden_states=hidden if batch.output_hidden_states else None,
            input_embeds=talker_embeds if batch.output_input_embeds else None,
            extras=extras,
        )

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict] | None:
        return output.extras  # the runner publishes what this hook returns as TextPayload.extras

    def _merge_media(self, batch: ModelInput, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter each row's audio, image and video encoder outputs into their placeholder positions;
        the talker's copy of the embeddings keeps zeros there instead (the reference's masked_scatter_)."""
        rows = [i for i, s in enumerate(batch.seqs) if s.model_state.media is not None]
        if not rows:
            return embeds, embeds
        merged, zeroed = embeds.clone(), embeds.clone()
        for i in rows:
            seq = batch.seqs[i]
            start = batch.context_lens[i] if batch.context_lens else 0
            for token, features in seq.model_state.media.items():
                mask = batch.input_ids[i] == token
                # A prefix-cache hit already holds the first placeholders' keys: skip their features.
                skip = seq.prompt_token_ids[:start].count(token)
                merged[i, mask] = features[skip:skip + int(mask.sum())].to(embeds.dtype)
                zeroed[i, mask] = 0
            seq.model_state.media = None  # only the prefill reads them
        return merged, zeroed

    def _positions(self, batch: ModelInput) -> torch.Tensor:
        """[3, B, T] M-RoPE positions: the prompt's own in it, position + rope_delta after it
        (decode, or a prefill recomputing generated tokens after a preemption)."""
        states = [s.model_state for s in batch.seqs]
        if batch.is_prefill:
            pos = batch.positions.new_zeros(3, *batch.positions.shape)
            for i, st in enumerate(states):
                start, n, prompt_len = batch.context_lens[i], batch.query_lens[i], st.mrope_positions.shape[1]
                split = max(0, min(n, prompt_len - start))  # this row's positions inside the prompt
                pos[:, i, :split] = st.mrope_positions[:, start:start + split]
                pos[:, i, split:n] = batch.positions[i, split:n] + st.rope_delta
            return pos
        delta = torch.tensor([st.rope_delta for st in states], device=batch.positions.device)
        return (batch.positions + delta[:, None]).expand(3, -1, -1)

    def close(self) -> None:
        self.model = self.lm = None
        self.encoder_cache.clear()


def image_processor(model_path: str, cls):
    """The checkpoint's image processor, or None when its preprocessor_config.json has no image fields."""
    import json
    from pathlib import Path

    from transformers.utils import cached_file

    path = cached_file(model_path, "preprocessor_config.json", _raise_exceptions_for_missing_entries=False)
    if path is None or "image_processor_type" not in json.loads(Path(path).read_text()):
        return None  # image input is refused at admission
    return cls.from_pretrained(model_path)

