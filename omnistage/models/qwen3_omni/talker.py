"""Qwen3-Omni talker + code predictor as one AR stage: thinker states in, codec frames out.

What `Qwen3OmniMoeForConditionalGeneration.generate` does after the thinker ("2. Prepare
talker input") and what its talker's `generate` does per frame, one engine step at a time:

Prompt (`build_prompt`, from the thinker's finished output, see `processors.talker_inputs`):
- the user turns only (system turns are dropped): `hidden_projection` of the thinker's
  `accept_hidden_layer` state on audio/image/video positions, `text_projection` of its input
  embedding elsewhere;
- the assistant turn: `<|im_start|>assistant\\n` and the first reply token, with tts_pad x 4
  and tts_bos between, plus the codec embeddings of [nothink, think_bos, think_eos, voice,
  codec_pad, codec_bos] on its last six positions;
- the rest of the reply (`trailing`: one row per later reply token, then tts_eos) is added
  to the input of decode step k, and tts_pad once it is spoken.
Or streamed, as the thinker goes (`processors.thinker_chunks`): the first chunk is the
thinker's prompt rows (`"streamed": True`), so the assistant turn's last row waits for the
first reply token; each later chunk (`extend_prompt`) brings reply rows in order, the final
one ending with tts_eos. The talker computes exactly what the whole hand-off gives it; it
only waits (`input_ready`) while the row its next step reads has not arrived.
M-RoPE positions: `get_rope_index` over the talker's ids when the prompt holds audio,
images or videos (as the reference), else plain positions.

Per step: the MoE decoder and `codec_head` give codebook 0 (ids from `vocab - 1024` up are
suppressed, codec EOS excepted); `on_sampled` runs the code predictor (a small AR model,
`num_code_groups - 1` batched steps started from the talker's last hidden state and codebook
0's embedding) for the other codebooks, which completes the frame. The next step's input is
the sum of the frame's embeddings (codebook 0 in the talker's table, the others in the code
predictor's). Frames go out in `TextPayload.extras["audio_codes"]` ([frames, G], CPU long)
with `extras["num_new_frames"]` (0 or 1).

The EOS step makes no frame. NOTE: the reference builds a frame's codebooks 1.. while
preparing the next step, so a talker stopped by `max_new_tokens` there voices one frame less
than it sampled; here every sampled code but EOS is voiced.

Prompt token ids are `codec_pad` (a suppressed id): the engine's repetition penalty then
sees only generated codes, as the reference's (it generates from `inputs_embeds` alone).

Prefix cache: those ids say nothing, so the prompt's blocks are keyed by digests of its rows
and positions (`media_spans.row_spans`, the last group once the streamed first reply row
completes it): a repeated conversation, whose rows the thinker's cache returns bit for bit,
hits here too, and the prefill feeds only the rows after the hit. Decode steps add reply rows
no digest covers, so only the prompt's blocks are published. (System turns are not in the
talker's prompt: a new question after the same system prompt shares none of it.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.media_spans import ROWS_PER_DIGEST, row_spans
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.qwen3_omni.code2wav import SAMPLE_RATE
from omnistage.models.qwen3_omni.weights import load_talker, speaker_ids
from omnistage.models.qwen_omni.handoff import check_voice
from omnistage.models.talker_codec.frames import FrameBuffer, frame_extras
from omnistage.models.talker_codec.side_sampling import SideSampler

_INPUT_KEYS = ("thinker_hidden", "thinker_embeds", "token_ids", "num_prompt", "audio_seqlens", "image_grid_thw",
               "video_grid_thw", "video_second_per_grid", "tts_embeds", "voice")
_STREAM_KEYS = ("reply_rows", "final")
NUM_SUPPRESSED = 1024  # the reference suppresses ids [vocab - 1024, vocab) but codec EOS
CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P = 50, 0.8  # the reference's code predictor sampling


@dataclass
class TalkerOutput(ModelOutput):
    last_hidden: torch.Tensor | None = None
    """[B, H] the decoder's final-norm hidden state at each row's last position (the code predictor's start)."""


@dataclass
class TalkerState:
    prompt_embeds: torch.Tensor | None
    """[P, H] prefill embeddings; dropped after prefill."""
    trailing: torch.Tensor
    """[R, H] reply rows for decode steps 0..R-1; tts_pad after."""
    tts_pad: torch.Tensor
    """[H]"""
    mrope_positions: torch.Tensor
    """[3, P]"""
    rope_delta: int
    frames: FrameBuffer
    """The generated frames ([G] CPU long each)."""
    num_decoded: int = 0
    next_embed: torch.Tensor | None = None
    """[H]: the last frame's summed embeddings (the next decode step's codec input)."""
    tts_eos: torch.Tensor | None = None
    """[H]: ends the reply rows once a streaming thinker has sent them all."""
    bos_codec: torch.Tensor | None = None
    """[H]: the codec part of the prompt's last row, waiting for reply row 3 (streamed start only)."""
    input_complete: bool = True
    """False while a streaming thinker has more rows to send."""


class Qwen3OmniTalker(ARModel):
    tokenizer = None  # emits codec frames, not text
    supports_prepacked_linears = True  # its code reads the embeddings' weights only
    predictor_top_k, predictor_top_p = CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P

    def __init__(self, model, omni_config, device: torch.device) -> None:
        config = model.config
        text = config.text_config
        layer_types = getattr(text, "layer_types", None) or ["full_attention"]
        if set(layer_types) != {"full_attention"}:
            raise ValueError(f"the talker supports full attention layers only, not {sorted(set(layer_types))}")
        self.model = model
        self.embed = model.get_input_embeddings()
        self.predictor = model.code_predictor
        self.device = device
        self.num_layers = text.num_hidden_layers
        self.max_position_embeddings = text.max_position_embeddings
        self.num_code_groups = config.num_code_groups
        self.speakers = speaker_ids(config)
        self.codec_eos = config.codec_eos_token_id
        self.codec_specials = (config.codec_nothink_id, config.codec_think_bos_id, config.codec_think_eos_id)
        self.codec_pad, self.codec_bos = config.codec_pad_id, config.codec_bos_id
        self.eos_token_ids = (self.codec_eos,)
        self.suppressed = [i for i in range(max(0, text.vocab_size - NUM_SUPPRESSED), text.vocab_size)
                           if i != self.codec_eos]
        self.im_start, self.assistant = omni_config.im_start_token_id, omni_config.assistant_token_id
        self.user, self.tts_pad_id = omni_config.user_token_id, omni_config.tts_pad_token_id
        thinker = omni_config.thinker_config
        self.media_ids = (thinker.audio_token_id, thinker.image_token_id, thinker.video_token_id)
        self.predictor_sampler = SideSampler(device, top_k=self.predictor_top_k, top_p=self.predictor_top_p)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> Qwen3OmniTalker:
        from transformers import Qwen3OmniMoeConfig

        omni_config = Qwen3OmniMoeConfig.from_pretrained(model_path)
        talker = cls(load_talker(model_path, device, dtype), omni_config, device)
        code2wav = omni_config.code2wav_config  # one frame: the product of its upsampling factors in samples
        talker.audio_frame_rate = SAMPLE_RATE / math.prod([*code2wav.upsample_rates, *code2wav.upsampling_ratios])
        return talker

    # --- prompt -------------------------------------------------------------------------------

    @torch.inference_mode()
    def build_prompt(self, inputs: Any) -> PromptInputs:
        """The whole hand-off (`processors.talker_inputs`), or a streamed start (`"streamed": True`,
        `processors.thinker_chunks`): the thinker's prompt rows only, so the prompt's last row waits
        for the first reply row and the reply rows follow through `extend_prompt`."""
        streamed = isinstance(inputs, dict) and bool(inputs.get("streamed"))
        keys = sorted(k for k in inputs if k != "streamed") if isinstance(inputs, dict) else None
        if keys != sorted(_INPUT_KEYS):
            got = keys if keys is not None else type(inputs).__name__
            raise ValueError(f"talker inputs must be a dict with keys {list(_INPUT_KEYS)} (and optionally "
                             f"'streamed'), built by the thinker -> talker processor; got {got}")
        check_voice(self.speakers, inputs["voice"], any_case=True)
        dtype = self.embed.weight.dtype
        hidden = inputs["thinker_hidden"].to(self.device, dtype)
        embeds = inputs["thinker_embeds"].to(self.device, dtype)
        ids = inputs["token_ids"].to(self.device)
        num_prompt = inputs["num_prompt"]
        prompt_ids = ids[:num_prompt]
        # 1. The user turns: positions whose turn (the token after the last <|im_start|>) is "user".
        positions = torch.arange(num_prompt, device=self.device)
        starts = torch.where(prompt_ids == self.im_start, positions, torch.full_like(positions, -1))
        turn = torch.cummax(starts, dim=0).values.clamp_min(0)
        is_user = prompt_ids[(turn + 1).clamp_max(num_prompt - 1)] == self.user
        is_media = torch.isin(prompt_ids, torch.tensor(self.media_ids, device=self.device))
        user = torch.empty(int(is_user.sum()), self.embed.weight.shape[1], device=self.device, dtype=dtype)
        user_media, user_text = is_media[is_user], ~is_media[is_user]
        if user_media.any():
            user[user_media] = self.model.hidden_projection(hidden[:num_prompt][is_user][user_media])
        user[user_text] = self.model.text_projection(embeds[:num_prompt][is_user][user_text])
        # 2. The assistant turn, from its <|im_start|> to the last fed position.
        pairs = (prompt_ids[:-1] == self.im_start) & (prompt_ids[1:] == self.assistant)
        if not pairs.any():
            raise ValueError("talker inputs: the thinker prompt has no '<|im_start|>assistant' turn")
        start = int(torch.nonzero(pairs).flatten()[-1])
        reply = self.model.text_projection(embeds[start:])
        tts_bos, tts_eos, tts_pad = self.model.text_projection(inputs["tts_embeds"].to(self.device, dtype)).unbind(0)
        if streamed:  # the first reply row comes with the thinker's next output
            reply = torch.cat([reply, reply.new_zeros(1, reply.shape[1])])
        elif reply.shape[0] < 4:
            # NOTE: the thinker stopped on its first token, so there is no reply token to start the
            # talker with; the reference generate() fails here. Speak the end of text instead.
            reply = torch.cat([reply, tts_eos[None]])
            tts_eos = None
        text_part = torch.cat([reply[:3], tts_pad.expand(4, -1), tts_bos[None], reply[3:4]])
        codec_ids = torch.tensor([*self.codec_specials, self.speakers[inputs["voice"].lower()], self.codec_pad,
                                  self.codec_bos], device=self.device)
        codec_part = torch.cat([text_part.new_zeros(3, text_part.shape[1]), self.embed(codec_ids)])
        assistant = text_part + codec_part[:text_part.shape[0]]
        prompt_embeds = torch.cat([user, assistant])
        trailing = reply[4:] if tts_eos is None else torch.cat([reply[4:], tts_eos[None]])
        # 3. Positions: TMRoPE over the talker's ids when audio, images or videos are in the prompt, else plain.
        talker_ids = torch.cat([prompt_ids[is_user],
                                torch.full((assistant.shape[0],), -1, device=self.device, dtype=torch.long)])
        audio_seqlens, grid, video_grid = inputs["audio_seqlens"], inputs["image_grid_thw"], inputs["video_grid_thw"]
        if audio_seqlens is not None or grid is not None or video_grid is not None:
            talker_ids[talker_ids < 0] = self.tts_pad_id  # the reference's ids for the assistant part
            on_device = (lambda t: None if t is None else t.to(self.device))
            # The reference generate() hands the talker no `use_audio_in_video` (and the thinker refuses
            # a spoken reply to such a prompt: see its build_prompt).
            pos, delta = self.model.get_rope_index(
                talker_ids[None], on_device(grid), on_device(video_grid), torch.ones_like(talker_ids[None]), False,
                on_device(audio_seqlens), inputs["video_second_per_grid"])
            mrope, delta = pos[:, 0], int(delta.item())
        else:
            mrope, delta = torch.arange(talker_ids.shape[0], device=self.device).expand(3, -1), 0
        state = TalkerState(prompt_embeds, trailing, tts_pad, mrope, delta, FrameBuffer((self.num_code_groups,)))
        num_rows = prompt_embeds.shape[0]
        known = num_rows
        if streamed:
            state.trailing, state.tts_eos, state.bos_codec = trailing[:0], tts_eos, codec_part[-1]
            state.input_complete = False
            known = (num_rows - 1) // ROWS_PER_DIGEST * ROWS_PER_DIGEST  # the last row waits for its reply row
        return PromptInputs([self.codec_pad] * num_rows, state, streamed=streamed,
                            media=row_spans(prompt_embeds, mrope, 0, known), cache_outputs=False)

    def is_token_reproducible(self, prompt: PromptInputs) -> bool:
        return True  # every prompt row is digested (`media`); decode rows are not (`cache_outputs`)

    @torch.inference_mode()
    def extend_prompt(self, seq, inputs: Any) -> None:
        if not isinstance(inputs, dict) or sorted(inputs) != sorted(_STREAM_KEYS):
            raise ValueError(f"a streamed talker chunk must be a dict with keys {list(_STREAM_KEYS)}")
        st: TalkerState = seq.model_state
        if st.input_complete:
            raise ValueError(f"talker request {seq.request_id!r}: a chunk after the final one")
        rows = self.model.text_projection(inputs["reply_rows"].to(self.device, self.embed.weight.dtype))
        if rows.shape[0] and st.bos_codec is not None:
            st.prompt_embeds[-1] = rows[0] + st.bos_codec  # reply row 3 completes the assistant turn
            st.bos_codec, rows = None, rows[1:]
            done = seq.media_spans[-1].end if seq.media_spans else 0  # the rest of the prompt's digests
            seq.media_spans += row_spans(st.prompt_embeds, st.mrope_positions, done)
        st.input_complete = bool(inputs["final"])
        if st.input_complete:
            if st.bos_codec is not None:
                raise ValueError(f"talker request {seq.request_id!r}: the final chunk leaves it without a reply row")
            rows = torch.cat([rows, st.tts_eos[None]])
        if rows.shape[0]:
            st.trailing = torch.cat([st.trailing, rows])

    def input_ready(self, seq) -> bool:
        st: TalkerState = seq.model_state
        if st.bos_codec is not None:
            return False  # the prefill needs the first reply row
        # decode step k reads reply row k; past the rows, tts_pad follows only once all are in
        return st.input_complete or seq.num_computed_tokens < seq.num_prompt_tokens or \
            st.num_decoded < st.trailing.shape[0]

    # --- decoder ----------------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        states: list[TalkerState] = [s.model_state for s in batch.seqs]
        if batch.is_prefill:
            b, t = batch.input_ids.shape
            x = states[0].prompt_embeds.new_zeros(b, t, states[0].prompt_embeds.shape[-1])
            positions = batch.positions.new_zeros(3, b, t)
            for i, st in enumerate(states):
                start, n = batch.context_lens[i], batch.query_lens[i]  # a prefix-cache hit skips rows ..start
                x[i, :n] = st.prompt_embeds[start:start + n]
                positions[:, i, :n] = st.mrope_positions[:, start:start + n]
                st.prompt_embeds = None
        else:
            rows = []
            for st in states:
                text = st.trailing[st.num_decoded] if st.num_decoded < st.trailing.shape[0] else st.tts_pad
                rows.append(st.next_embed + text)
                st.num_decoded += 1
            x = torch.stack(rows)[:, None]
            delta = torch.tensor([st.rope_delta for st in states], device=batch.positions.device)
            positions = (batch.positions + delta[:, None]).expand(3, -1, -1)
        out = self.model.model(inputs_embeds=x, position_ids=positions, attention_mask=sdpa_mask(batch),
                               cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        logits = self.model.codec_head(last).float()
        logits[:, self.suppressed] = -float("inf")
        return TalkerOutput(logits=logits, last_hidden=last)

    # --- code predictor ---------------------------------------------------------------------------

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict]:
        speaking = [i for i in range(len(batch.seqs)) if int(token_ids[i]) != self.codec_eos]
        frames = embeds = None
        if speaking:
            rows = torch.tensor(speaking, device=token_ids.device)
            frames, embeds = self._predict(output.last_hidden[rows], token_ids[rows],
                                           [batch.seqs[i] for i in speaking])
            frames_cpu = frames.cpu()
        extras = []
        for i, seq in enumerate(batch.seqs):
            st: TalkerState = seq.model_state
            new = 0
            if frames is not None and i in speaking:
                k = speaking.index(i)
                st.frames.add(frames_cpu[k])
                st.next_embed = embeds[k]
                new = 1
            extras.append(frame_extras(st.frames, new))
        return extras

    def _predict(self, hidden: torch.Tensor, first: torch.Tensor, seqs: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Codebooks 1..G-1 per row, as the reference's `code_predictor.generate` -> ([B, G] frames,
        [B, H] the frame's summed embeddings)."""
        from transformers import DynamicCache

        predictor = self.predictor
        tables = predictor.get_input_embeddings()
        rows = [self.predictor_sampler.row(seq) for seq in seqs]
        cache = DynamicCache(config=predictor.config)
        first_embed = self.embed(first)
        x = torch.stack([hidden, first_embed], dim=1)  # [B, 2, H]
        codes, parts = [first], [first_embed[:, None]]
        for step in range(self.num_code_groups - 1):
            out = predictor.model(inputs_embeds=x, cache=cache, use_cache=True)
            logits = predictor.lm_head[step](out.last_hidden_state[:, -1]).float()
            token = self.predictor_sampler(logits, rows)
            codes.append(token)
            x = tables[step](token)[:, None]
            parts.append(x)
        # Summed as the reference does (one reduction over the stacked codebooks: the same floats).
        return torch.stack(codes, dim=1), torch.cat(parts, dim=1).sum(1)

    def release(self, seq) -> None:
        self.predictor_sampler.release(seq)

    def close(self) -> None:
        self.model = self.embed = self.predictor = None
