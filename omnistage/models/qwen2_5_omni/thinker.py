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
from omnistage.ar.media_spans import fed_rows
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.qwen_omni.media import MediaPrompt, OmniMedia, image_processor, prompt_options
from omnistage.models.chat_media import chat_media
from omnistage.models.qwen2_5_omni.processors import DEFAULT_VOICE
from omnistage.models.qwen_omni.video import VideoRules, interleave_in_chunks
from omnistage.models.qwen2_5_omni.weights import load_speakers, load_thinker
from omnistage.models.qwen_omni.handoff import check_voice
from omnistage.models.qwen_omni.positions import RopeIndex, mrope_positions



@dataclass
class ThinkerState:
    mrope_positions: torch.Tensor
    """[3, L] long: the prompt's M-RoPE positions."""
    rope_delta: int
    """Decode position = sequence position + rope_delta."""
    media: MediaPrompt | None = None
    """The prompt's media, prepared for the encoders, which the first prefill runs; dropped after it."""
    talker_embeds: torch.Tensor | None = None
    """[3, H]: embeddings of the voice's text-BOS, tts_text_eos, tts_text_pad."""


class OmniThinker(OmniMedia, ARModel):
    # Qwen2_5OmniProcessor pads every clip to the feature extractor's length (300 s).
    audio_padding = "max_length"

    # Prompts are token ids with M-RoPE positions known per position, so they chunk, hit the
    # prefix cache and recompute; prompts with media hit it by their items' digests
    # (`PromptInputs.media`) and are prefilled whole after the hit (the engine's rule).
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
        self.speakers = speakers
        self.talker_text_ids = talker_text_ids  # (tts_text_eos, tts_text_pad), thinker-vocab ids
        self.eos_token_ids = eos
        self.device = device
        self.rope_index = RopeIndex(model.get_rope_index, device)
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
        (see `qwen_omni.video`).
        """
        inputs, voice, with_audio = prompt_options(inputs, DEFAULT_VOICE)
        if voice is not None:
            check_voice(self.speakers, voice)
        media = chat_media(inputs)
        ids = super().build_prompt(inputs).token_ids
        with torch.inference_mode():
            prompt = self._prepare_media(ids, media, with_audio)
            positions, delta = self.rope_index(prompt, with_audio)
            talker_embeds = None
            if voice is not None:
                special = [self.speakers[voice]["bos_token"], *self.talker_text_ids]
                talker_embeds = self.lm.embed_tokens(torch.tensor(special, device=self.device))
        state = ThinkerState(positions, delta, media=prompt if prompt.spans else None, talker_embeds=talker_embeds)
        return PromptInputs(prompt.ids, state, media=prompt.spans)

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
        out = self.lm(inputs_embeds=embeds, position_ids=mrope_positions(batch),
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
        """Encode each row's media items it feeds and scatter their outputs into its placeholder positions;
        the talker's copy of the embeddings keeps zeros there instead (the reference's masked_scatter_)."""
        rows = [i for i, s in enumerate(batch.seqs) if s.model_state.media is not None]
        if not rows:
            return embeds, embeds
        merged, zeroed = embeds.clone(), embeds.clone()
        for i in rows:
            state = batch.seqs[i].model_state
            features_by_token, _ = self._encode_fed(state.media, batch.context_lens[i])
            for token, features in features_by_token.items():
                mask = batch.input_ids[i] == token
                merged[i, mask] = fed_rows(features, mask).to(embeds.dtype)
                zeroed[i, mask] = 0
            state.media = None  # only the prefill reads them
        return merged, zeroed

    def close(self) -> None:
        self.model = self.lm = None
