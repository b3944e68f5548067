"""CSM's backbone + depth decoder as one AR stage: text (+ a reference clip) in, codec frames out.

What `CsmForConditionalGeneration.generate` does per frame, one engine step at a time,
over a continuous batch:

1. the backbone (a Llama) reads the prompt embeddings (prefill) or the previous frame's
   summed codebook embeddings (decode) and its head gives codebook 0's logits; the
   engine's sampler picks codebook 0;
2. `on_sampled`: the depth decoder, started from the backbone's last hidden state and
   codebook 0, generates codebooks 1..N-1 (N-1 small batched forwards), which completes
   the frame. The frame is kept in `seq.model_state` (the next step's input) and the
   frames to voice so far go out in `TextPayload.extras["audio_codes"]` ([frames, N], CPU
   long; an all-EOS frame is not voiced, as the reference cuts the audio there) with
   `extras["num_new_frames"]` (0 or 1) for this step.

The prompt is the reference's chat template: an optional context turn (reference text
and its audio, encoded by the checkpoint's Mimi encoder) and the turn to speak, both
`[speaker]text`. Embeddings of audio positions are the codes' summed embeddings, and
`<|audio_eos|>` is an all-EOS frame, as the reference's `_merge_input_ids_with_input_values`.

Stopping: the reference stops once a frame's first N-1 codebooks are all
`codebook_eos_token_id` (not a single token id), so `on_sampled` rewrites that row's
sampled token to `eos_frame_id`, an id past the backbone vocabulary that is this model's
only EOS id. Codes at or above the codec's codebook size (the padding ids of the 2051-way
heads) are masked: Mimi cannot decode them (the reference fails on them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs
from omnistage.core.errors import RequestError
from omnistage.media.audio import resample
from omnistage.models.csm.prompt import parse_prompt
from omnistage.models.talker_codec.frames import FrameBuffer, frame_extras
from omnistage.models.talker_codec.side_sampling import SideSampler


@dataclass
class CsmOutput(ModelOutput):
    last_hidden: torch.Tensor | None = None
    """[B, H] the backbone's final-norm hidden state at each row's last position (the depth decoder's start)."""


@dataclass
class TalkerState:
    prompt_embeds: torch.Tensor | None
    """[L, H] prefill embeddings; dropped after prefill."""
    frames: FrameBuffer
    """The frames to voice so far ([N] CPU long each)."""
    last_frame: torch.Tensor | None = None
    """[N] on the model's device: the next decode step's input."""


class CsmTalker(ARModel):
    tokenizer = None  # emits codec frames, not text
    supports_prepacked_linears = True  # transformers' layers only call their linears (the codebook heads are no nn.Linear)

    def __init__(self, model, processor, device: torch.device) -> None:
        config = model.config
        self.model = model
        self.processor = processor
        self.device = device
        self.num_layers = config.num_hidden_layers
        self.kv_dims = kv_dims(config)
        self.max_position_embeddings = config.max_position_embeddings
        self.num_codebooks = config.num_codebooks
        self.codebook_eos = config.codebook_eos_token_id
        self.codebook_size = config.codec_config.codebook_size
        self.audio_token_id = config.audio_token_id
        self.audio_eos_token_id = config.audio_eos_token_id
        self.sample_rate = config.codec_config.sampling_rate
        self.audio_frame_rate = config.codec_config.frame_rate  # one backbone step: one Mimi frame
        self.eos_frame_id = config.vocab_size
        self.eos_token_ids = (self.eos_frame_id,)
        self.depth_sampler = SideSampler(device)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> CsmTalker:
        from transformers import AutoProcessor, CsmForConditionalGeneration

        model = CsmForConditionalGeneration.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
        return cls(model.to(device).eval(), AutoProcessor.from_pretrained(model_path), device)

    # --- prompt -------------------------------------------------------------------------------

    @torch.inference_mode()
    def build_prompt(self, inputs: Any) -> PromptInputs:
        prompt = parse_prompt(inputs)
        speaker = str(prompt.speaker)
        conversation, clips = [], []
        if prompt.ref_audio is not None:
            clips.append(resample(prompt.ref_audio, prompt.ref_sample_rate, self.sample_rate))
            conversation.append({"role": speaker, "content": [{"type": "text", "text": prompt.ref_text},
                                                              {"type": "audio"}]})
        conversation.append({"role": speaker, "content": [{"type": "text", "text": prompt.text}]})
        text = self.processor.apply_chat_template(conversation, tokenize=False)
        enc = self.processor(text=text, audio=clips or None)
        ids = enc["input_ids"][0].to(self.device)
        embeds = self.model.embed_text_tokens(ids)
        if clips:
            self._embed_audio(ids, embeds, enc["input_values"][0, :, :enc["input_values_cutoffs"][0, 0]])
        return PromptInputs(ids.tolist(), TalkerState(embeds, FrameBuffer((self.num_codebooks,))))

    def _embed_audio(self, ids: torch.Tensor, embeds: torch.Tensor, clip: torch.Tensor) -> None:
        """Put the clip's code embeddings on its <|AUDIO|> positions and an EOS frame's on <|audio_eos|>."""
        codec = self.model.codec_model
        codes = codec.encode(clip[None].to(self.device, codec.dtype)).audio_codes[0].T  # [frames, N]
        audio_positions = ids == self.audio_token_id
        num = int(audio_positions.sum())
        if codes.shape[0] < num:
            raise RequestError("ref_audio", f"ref_audio: the codec made {codes.shape[0]} frames for {num} audio tokens")
        embed = self.model.backbone_model.embed_tokens
        embeds[audio_positions] = embed(codes[None, :num])[0].to(embeds.dtype)
        eos = torch.full((1, 1, self.num_codebooks), self.codebook_eos, dtype=torch.long, device=self.device)
        embeds[ids == self.audio_eos_token_id] = embed(eos)[0].to(embeds.dtype)

    # --- backbone -------------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        states: list[TalkerState] = [s.model_state for s in batch.seqs]
        if batch.is_prefill:
            b, t = batch.input_ids.shape
            x = states[0].prompt_embeds.new_zeros(b, t, states[0].prompt_embeds.shape[-1])
            for i, st in enumerate(states):
                x[i, :batch.query_lens[i]] = st.prompt_embeds
                st.prompt_embeds = None
        else:
            x = self.model.backbone_model.embed_tokens(torch.stack([st.last_frame for st in states])[:, None])
        out = self.model.backbone_model(inputs_embeds=x, position_ids=batch.positions,
                                        attention_mask=batch.attention_mask, cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        logits = self.model.lm_head(last).float()
        logits[:, self.codebook_size:] = -float("inf")
        return CsmOutput(logits=logits, last_hidden=last)

    # --- depth decoder --------------------------------------------------------------------------

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict]:
        frames = self._depth_decode(output.last_hidden, token_ids, batch.seqs)
        frames_cpu = frames.cpu()
        is_eos = frames_cpu == self.codebook_eos
        stops = is_eos[:, :-1].all(dim=-1).tolist()  # the reference's stop rule
        silent = is_eos.all(dim=-1).tolist()  # the reference's audio cutoff: not voiced
        extras = []
        for i, seq in enumerate(batch.seqs):
            st: TalkerState = seq.model_state
            st.last_frame = frames[i]
            if not silent[i]:
                st.frames.add(frames_cpu[i])
            if stops[i] and seq.num_output_tokens + 1 >= seq.params.min_tokens:
                token_ids[i] = self.eos_frame_id  # the engine's stop rule sees this model's one EOS id
            extras.append(frame_extras(st.frames, 0 if silent[i] else 1))
        return extras

    def _depth_decode(self, hidden: torch.Tensor, first: torch.Tensor, seqs: list) -> torch.Tensor:
        """Codebooks 1..N-1 for each row, as the reference's `depth_decoder.generate` -> [B, N] frames."""
        from transformers import DynamicCache

        depth = self.model.depth_decoder
        rows = [self.depth_sampler.row(seq) for seq in seqs]
        cache = DynamicCache(config=depth.config)
        # Position 0 is a placeholder the model replaces with the backbone's hidden state.
        ids = torch.stack([torch.zeros_like(first), first], dim=1)
        codes = [first]
        for k in range(self.num_codebooks - 1):
            out = depth(input_ids=ids, backbone_last_hidden_state=hidden if k == 0 else None, cache=cache,
                        use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1].float()
            logits[:, self.codebook_size:] = -float("inf")
            token = self.depth_sampler(logits, rows)
            codes.append(token)
            ids = token[:, None]
        return torch.stack(codes, dim=1)

    def release(self, seq) -> None:
        self.depth_sampler.release(seq)

    def close(self) -> None:
        self.model = self.processor = None
