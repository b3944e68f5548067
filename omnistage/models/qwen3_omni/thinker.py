"""Qwen3-Omni thinker as an AR stage: text, audio, images and video in, text out, plus what the talker reads.

Wraps `Qwen3OmniMoeThinkerForConditionalGeneration` (an MoE language model with audio and
vision encoders) without patching it: the engine's masks and slot KV cache go into its
language model through the public `attention_mask` and `cache=` arguments.

Per request (`ThinkerState`), prepared once at admission:
- audio features: each `<|audio_pad|>` of the chat template is expanded to as many tokens
  as the audio encoder makes of that clip (as `Qwen3OmniMoeProcessor` does, one request's
  clips padded to the longest), and the encoder's outputs are scattered into those
  positions at prefill;
- images: the same for `<|image_pad|>` and the vision encoder, the pixels prepared by the
  checkpoint's image processor on its PIL/numpy path (`Qwen2VLImageProcessorPil`, no
  torchvision), one token per merged patch; the encoder's deepstack features are added to
  the outputs of the first decoder layers at those positions (`deepstack_visual_embeds`);
- videos: frames sampled and patched on the PIL/numpy path (`qwen_omni.video`), encoded
  like images (deepstack included); with `use_audio_in_video` their frame tokens and their
  own audio's are merged by time, as `Qwen3OmniMoeProcessor` lays them out;
- M-RoPE positions `[3, L]` and the decode offset (`rope_delta`) from the model's own
  `get_rope_index` (plain `arange` for text; audio and image spans follow TMRoPE).

When a talker is downstream (the request asks for hidden states and input embeddings),
every step returns, per fed position, the hidden state of layer `accept_hidden_layer` of
the talker config (`ModelOutput.hidden_states`; the reference's
`hidden_states[accept_hidden_layer]`) and the input embeddings with the audio features in
place (the reference's `hidden_states[0]`), and in `extras` what the talker needs besides:
the prompt ids, the audio lengths, image and video grids, and the embeddings of tts_bos / tts_eos /
tts_pad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.hf_model import eos_token_ids, load_tokenizer
from omnistage.ar.media_spans import fed_rows
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.qwen_omni.media import MediaPrompt, OmniMedia, image_processor, prompt_options
from omnistage.models.chat_media import chat_media
from omnistage.models.qwen_omni.positions import RopeIndex, mrope_positions
from omnistage.models.qwen_omni.video import VideoRules, interleave_by_time
from omnistage.models.qwen3_omni.processors import DEFAULT_VOICE
from omnistage.models.qwen3_omni.weights import load_thinker, speaker_ids
from omnistage.models.qwen_omni.handoff import check_voice



@dataclass
class ThinkerState:
    mrope_positions: torch.Tensor
    """[3, L] long: the prompt's M-RoPE positions."""
    rope_delta: int
    """Decode position = sequence position + rope_delta."""
    media: MediaPrompt | None = None
    """The prompt's media, prepared for the encoders, which the first prefill runs; dropped after it."""
    talker_extras: dict | None = None
    """What the talker reads besides the hidden states (None: no talker downstream)."""


class Qwen3OmniThinker(OmniMedia, ARModel):
    # Qwen3OmniMoeProcessor pads a request's clips to the longest of them.
    audio_padding = "longest"
    # Prompts are token ids with M-RoPE positions known per position, so they chunk, hit the
    # prefix cache (with the talker's rows, ar/block_states.py) and recompute; prompts with media
    # hit it by their items' digests (`PromptInputs.media`) and are prefilled whole after the hit.
    supports_chunked_prefill = True
    supports_prepacked_linears = True  # transformers' towers and layers only call their linears (experts are no nn.Linear)

    def __init__(self, model, tokenizer, feature_extractor, speakers: dict[str, int], tts_ids: tuple[int, int, int],
                 accept_hidden_layer: int, eos: tuple[int, ...], device: torch.device, image_processor=None) -> None:
        text_config = model.config.text_config
        layer_types = getattr(text_config, "layer_types", None) or ["full_attention"]
        if set(layer_types) != {"full_attention"}:
            raise ValueError(f"the thinker supports full attention layers only, not {sorted(set(layer_types))}")
        self.model = model
        self.lm = model.model.language_model
        self.tokenizer = tokenizer
        self.feature_extractor = feature_extractor
        self.image_processor = image_processor
        self.speakers = speakers
        self.tts_ids = tts_ids  # (tts_bos, tts_eos, tts_pad), thinker-vocab ids
        self.accept_hidden_layer = accept_hidden_layer
        self.eos_token_ids = eos
        self.device = device
        self.rope_index = RopeIndex(model.get_rope_index, device)
        self.num_layers = text_config.num_hidden_layers
        self.max_position_embeddings = text_config.max_position_embeddings
        self.audio_token_id = model.config.audio_token_id
        self.image_token_id = model.config.image_token_id
        self.video_token_id = model.config.video_token_id
        self.audio_bos_id = model.config.audio_start_token_id
        # The processor's <|audio_end|>; the released config names it, the zoo's may not.
        self.audio_eos_id = getattr(model.config, "audio_end_token_id", None) or tokenizer.convert_tokens_to_ids(
            "<|audio_end|>")
        # Qwen3OmniMoeProcessor's video defaults: 1 fps (its `video_second_per_grid` fallback), frame size
        # bounds, and its token layout's time units (it merges frames and audio by time).
        self.video_rules = VideoRules(fps=1.0, min_pixels=128 * 32 * 32, max_pixels=768 * 32 * 32,
                                      position_id_per_seconds=13.0, seconds_per_chunk=2.0)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> Qwen3OmniThinker:
        from transformers import Qwen3OmniMoeConfig, WhisperFeatureExtractor
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil


        config = Qwen3OmniMoeConfig.from_pretrained(model_path)
        model = load_thinker(model_path, device, dtype)
        try:
            features = WhisperFeatureExtractor.from_pretrained(model_path)
        except OSError:
            features = None  # no preprocessor_config.json: audio input is refused at admission
        tts_ids = (config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id)
        talker = config.talker_config
        return cls(model, load_tokenizer(model_path), features, speaker_ids(talker), tts_ids,
                   talker.accept_hidden_layer, eos_token_ids(model_path, model.config), device,
                   image_processor(model_path, Qwen2VLImageProcessorPil))

    # --- admission -----------------------------------------------------------------------------

    def build_prompt(self, inputs: Any) -> PromptInputs:
        """The generic inputs (see `ARModel.build_prompt`), plus `voice` when a talker is downstream
        and `use_audio_in_video`; chat media parts as Qwen2.5-Omni's (`models.chat_media`)."""
        inputs, voice, with_audio = prompt_options(inputs, DEFAULT_VOICE)
        if voice is not None:
            check_voice(self.speakers, voice, any_case=True)
            if with_audio:
                # NOTE: the reference talker cannot place a video's own audio: its get_rope_index reads
                # `talker_config.audio_config`, which the config does not have (transformers 5.24), so
                # generate() fails there. Only the thinker takes such prompts.
                raise ValueError("use_audio_in_video works with text output only on Qwen3-Omni (the talker "
                                 "of transformers' Qwen3-Omni cannot lay out a video's own audio); ask for "
                                 "modalities ['text']")
        media = chat_media(inputs)
        ids = super().build_prompt(inputs).token_ids
        with torch.inference_mode():
            prompt = self._prepare_media(ids, media, with_audio)
            positions, delta = self.rope_index(prompt, with_audio)
            extras = None
            if voice is not None:
                special = self.lm.embed_tokens(torch.tensor(self.tts_ids, device=self.device))
                extras = {"prompt_token_ids": torch.tensor(prompt.ids, device=self.device), "audio_seqlens": prompt.audio_seqlens,
                          "image_grid_thw": prompt.image_grid, "video_grid_thw": prompt.video_grid,
                          "video_second_per_grid": prompt.seconds_per_grid, "tts_embeds": special, "voice": voice}
        state = ThinkerState(positions, delta, media=prompt if prompt.spans else None, talker_extras=extras)
        return PromptInputs(prompt.ids, state, media=prompt.spans)

    def _vision_features(self, out: Any) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        return torch.cat(out.pooler_output), [torch.cat(per_item) for per_item in out.deepstack_features]

    def _interleave(self, times, num_audio: int) -> list[str]:
        return interleave_by_time(times, num_audio)

    @staticmethod
    def _audio_token_counts(seqlens: torch.Tensor) -> list[int]:
        from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

        return _get_feat_extract_output_lengths(seqlens).tolist()

    # --- the forward ---------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        embeds = self.lm.embed_tokens(batch.input_ids)
        visual = {}
        if batch.is_prefill:
            embeds, visual = self._merge_media(batch, embeds)
        want_hidden = batch.output_hidden_states
        out = self.lm(inputs_embeds=embeds, position_ids=mrope_positions(batch), attention_mask=sdpa_mask(batch),
                      cache=cache, use_cache=True,
                      output_hidden_states=[self.accept_hidden_layer] if want_hidden else False, **visual)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        states = [s.model_state for s in batch.seqs]
        extras = [st.talker_extras or {} for st in states]
        return ModelOutput(
            logits=self.model.lm_head(last),
            hidden_states=out.hidden_states[self.accept_hidden_layer] if want_hidden else None,
            input_embeds=embeds if batch.output_input_embeds else None,
            extras=extras,
        )

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict] | None:
        return output.extras  # the runner publishes what this hook returns as TextPayload.extras

    def _merge_media(self, batch: ModelInput, embeds: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Encode each row's media items it feeds and scatter their outputs into its placeholder positions,
        and gather the rows' deepstack features in the order the language model adds them (row-major over
        the batch's image and video positions)."""
        states = [s.model_state for s in batch.seqs]
        if all(st.media is None for st in states):
            return embeds, {}
        embeds = embeds.clone()
        visual = torch.isin(batch.input_ids, torch.tensor([self.image_token_id, self.video_token_id],
                                                          device=batch.input_ids.device))
        layers: dict[int, list[torch.Tensor]] = {}
        for i, st in enumerate(states):
            if st.media is None:
                continue
            features_by_token, deepstack = self._encode_fed(st.media, batch.context_lens[i])
            for token, features in features_by_token.items():
                mask = batch.input_ids[i] == token
                embeds[i, mask] = fed_rows(features, mask).to(embeds.dtype)
            for k, feature in enumerate(deepstack or ()):
                layers.setdefault(k, []).append(fed_rows(feature, visual[i]))
            st.media = None  # only the prefill reads it
        if not layers:
            return embeds, {}
        deepstack = [torch.cat(layers[k]).to(embeds.dtype) for k in sorted(layers)]
        return embeds, {"visual_pos_masks": visual, "deepstack_visual_embeds": deepstack}

    def close(self) -> None:
        self.model = self.lm = None
