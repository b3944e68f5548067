"""Moshi's temporal transformer + depth decoder as one AR stage: user audio in, text + codes out.

Each engine step is one 80 ms frame (Mimi's 12.5 Hz), what `MoshiForConditionalGeneration`
does per position, over a continuous batch:

1. the input of position p is the sum of 17 embeddings, as the reference's
   `_prepare_inputs_embeds_for_generation`: Moshi's 8 codebooks and the user's 8 (one
   table each), then the previous text token. Position 0 is the reference's
   unconditional start: the initial text id (`vocab_size`) and BOS codes everywhere;
2. the temporal transformer's text head gives the text token; the engine samples it;
3. `on_sampled`: the depth decoder, started from the temporal transformer's last hidden
   state and that text token, generates Moshi's 8 codes `m_p` one codebook at a time.

The acoustic delay: codebooks 1..7 lag codebook 0 by one frame, in both streams, as the
reference's `build_delay_pattern_mask`. So position p reads Moshi's `m_{p-1}` (codebooks
1..7 are BOS at p = 1) and the user's frame `u_{p-1}` for codebook 0 with `u_{p-2}` for
1..7 (BOS at p = 1); and the audio frame k Moshi speaks is `m_k[0]` with `m_{k+1}[1..7]`,
complete one step later. Each step's output carries `extras["audio_codes"]` (the frames
so far, [frames, 8] CPU long) and `extras["num_new_frames"]` (0 at position 0, else 1).

The user's audio is 24 kHz float PCM. It is Mimi-encoded as it comes, with the encoder's
convolution padding and transformer cache carried (`MimiModel.encode(use_streaming=True)`),
so a clip sent in pieces gets the codes of the clip sent whole. A request whose input is
`final` hears silence once its audio has run out: the codes of one silent frame, as the
reference's `blank_user_audio_codes`. A streamed request (not `final`) waits for its next
frame (`input_ready`): the session's audio paces the model. Moshi never stops on its own:
`max_tokens` (or the session's end) does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.ar.sampler import Sampler
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.errors import RequestError

INPUT_KEYS = ("audio", "sample_rate", "final")


@dataclass
class MoshiOutput(ModelOutput):
    last_hidden: torch.Tensor | None = None
    """[B, H] the temporal transformer's final-norm hidden state (the depth decoder's start)."""


@dataclass
class _DepthRow:
    """The sampler's view of a sequence for depth-decoder codes: its temperature, top-k/p and
    seed, without the text-only rules (repetition penalty, min_tokens, stop ids)."""

    request_id: str
    params: SamplingParams
    all_token_ids: list[int] = field(default_factory=list)
    needs_min_tokens_mask: bool = False
    stop_ids: frozenset = frozenset()


@dataclass
class MoshiState:
    pending: np.ndarray
    """User samples not yet a whole frame."""
    user_frames: list[torch.Tensor]
    """The user's Mimi codes, [8] each on the model's device, one per 80 ms frame."""
    frames: torch.Tensor
    """[capacity, 8] CPU long: Moshi's audio frames, `num_frames` of them so far."""
    input_final: bool = False
    encoder_cache: Any = None
    padding_cache: Any = None
    position: int = 0
    """The next forward's position."""
    last_codes: torch.Tensor | None = None
    """[8] Moshi's codes from the last depth decode (`m_{p-1}`)."""
    num_frames: int = 0
    depth_row: _DepthRow | None = None

    def add_frame(self, frame: torch.Tensor) -> None:
        if self.num_frames == self.frames.shape[0]:
            grown = self.frames.new_zeros(2 * self.frames.shape[0], self.frames.shape[1])
            grown[:self.num_frames] = self.frames
            self.frames = grown  # earlier outputs keep views of the old buffer, whose rows are final
        self.frames[self.num_frames] = frame
        self.num_frames += 1


class MoshiDuplex(ARModel):
    supports_prepacked_linears = True  # its layers only call their linears (MoshiFlexibleLinear is no nn.Linear)

    def __init__(self, model, tokenizer, device: torch.device) -> None:
        config = model.config
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.num_layers = config.num_hidden_layers
        self.kv_dims = kv_dims(config)
        self.max_position_embeddings = config.max_position_embeddings
        self.num_codebooks = config.num_codebooks
        self.bos = config.audio_vocab_size  # the codes' BOS / padding id, past the codebooks
        self.initial_text_id = config.vocab_size
        codec = config.audio_encoder_config
        self.sample_rate = codec.sampling_rate
        self.frame_samples = int(codec.sampling_rate / codec.frame_rate)
        self.audio_frame_rate = codec.frame_rate
        self.eos_token_ids = ()
        self.depth_sampler = Sampler(device)
        blank = torch.zeros(1, 1, self.frame_samples, dtype=model.dtype, device=device)
        with torch.inference_mode():
            self.blank_codes = model.audio_encoder.encode(blank, num_quantizers=self.num_codebooks)[0][0, :, 0]

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> MoshiDuplex:
        from transformers import AutoTokenizer, MoshiForConditionalGeneration

        model = MoshiForConditionalGeneration.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
        return cls(model.to(device).eval(), AutoTokenizer.from_pretrained(model_path), device)

    # --- input ----------------------------------------------------------------------------------

    def build_prompt(self, inputs: Any) -> PromptInputs:
        st = MoshiState(pending=np.zeros(0, dtype=np.float32), user_frames=[],
                        frames=torch.zeros(64, self.num_codebooks, dtype=torch.long))
        self._add_audio(st, inputs)
        return PromptInputs([self.initial_text_id], st, streamed=not st.input_final)

    def check_prompt_size(self, inputs: Any, max_model_len: int) -> None:
        return  # one prompt token; the audio's length is bounded by max_tokens

    def is_token_reproducible(self, prompt: PromptInputs) -> bool:
        return False  # positions hold audio embeddings

    def extend_prompt(self, seq, inputs: Any) -> None:
        st: MoshiState = seq.model_state
        if st.input_final:
            raise RequestError("audio", "audio after the final chunk")
        self._add_audio(st, inputs)

    def input_ready(self, seq) -> bool:
        st: MoshiState = seq.model_state
        return st.input_final or st.position == 0 or len(st.user_frames) >= st.position

    @torch.inference_mode()
    def _add_audio(self, st: MoshiState, inputs: Any) -> None:
        if not isinstance(inputs, dict) or not set(inputs) <= set(INPUT_KEYS) or "audio" not in inputs:
            raise RequestError("audio", f"Moshi takes a dict with 'audio' and optionally 'sample_rate', 'final'; "
                                        f"got {sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__}")
        rate = inputs.get("sample_rate", self.sample_rate)
        if rate != self.sample_rate:
            raise RequestError("sample_rate", f"Moshi hears {self.sample_rate} Hz audio, got {rate!r}")
        audio = np.asarray(inputs["audio"], dtype=np.float32)
        if audio.ndim != 1 or not np.isfinite(audio).all():
            raise RequestError("audio", "audio must be mono float samples (a 1-D array of finite values)")
        st.pending = np.concatenate([st.pending, audio])
        st.input_final = bool(inputs.get("final", False))
        if st.input_final and st.pending.size % self.frame_samples:  # the last part frame, padded with silence
            st.pending = np.pad(st.pending, (0, self.frame_samples - st.pending.size % self.frame_samples))
        num = st.pending.size // self.frame_samples * self.frame_samples
        if num == 0:
            return
        clip = torch.from_numpy(st.pending[:num]).to(self.device, self.model.dtype)[None, None]
        st.pending = st.pending[num:]
        out = self.model.audio_encoder.encode(clip, num_quantizers=self.num_codebooks, use_streaming=True,
                                              encoder_cache=st.encoder_cache, padding_cache=st.padding_cache)
        st.encoder_cache, st.padding_cache = out.encoder_cache, out.padding_cache
        st.user_frames.extend(out.audio_codes[0].T)

    # --- temporal transformer ---------------------------------------------------------------------

    def _audio_codes(self, st: MoshiState) -> torch.Tensor:
        """[16] position p's codes: Moshi's 8 then the user's 8, with the acoustic delay."""
        p, bos = st.position, torch.full((self.num_codebooks,), self.bos, device=self.device)
        if p == 0:
            return torch.cat([bos, bos])
        moshi = st.last_codes.clone()
        user = torch.empty_like(bos)
        user[0] = self._user_frame(st, p - 1)[0]
        if p == 1:
            moshi[1:] = self.bos
            user[1:] = self.bos
        else:
            user[1:] = self._user_frame(st, p - 2)[1:]
        return torch.cat([moshi, user])

    def _user_frame(self, st: MoshiState, k: int) -> torch.Tensor:
        return st.user_frames[k] if k < len(st.user_frames) else self.blank_codes

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        states: list[MoshiState] = [s.model_state for s in batch.seqs]
        codes = torch.stack([self._audio_codes(st) for st in states])[:, :, None]  # [B, 16, 1]
        for st in states:
            st.position += 1
        # The reference's order: the 16 audio embeddings summed first, then the text's added.
        audio = sum(self.model.embed_tokens[k](codes[:, k]) for k in range(codes.shape[1]))
        x = audio + self.model.decoder.model.embed_tokens(batch.input_ids)
        out = self.model.decoder.model(inputs_embeds=x, position_ids=batch.positions, attention_mask=sdpa_mask(batch),
                                       cache=cache, use_cache=True)
        last = out.last_hidden_state[:, -1]
        logits = self.model.decoder.lm_head(last).float()
        return MoshiOutput(logits=logits, last_hidden=last)

    # --- depth decoder -----------------------------------------------------------------------------

    def on_sampled(self, batch: ModelInput, output: ModelOutput, token_ids: torch.Tensor) -> list[dict]:
        codes = self._depth_decode(output.last_hidden, token_ids, batch.seqs)
        codes_cpu = codes.cpu()
        extras = []
        for i, seq in enumerate(batch.seqs):
            st: MoshiState = seq.model_state
            new = 0
            if st.last_codes is not None:  # frame p-1: its semantic code from the last step, acoustic from this one
                st.add_frame(torch.cat([st.last_codes[:1].cpu(), codes_cpu[i, 1:]]))
                new = 1
            st.last_codes = codes[i]
            extras.append({"audio_codes": st.frames[:st.num_frames], "num_new_frames": new})
        return extras

    def _depth_decode(self, hidden: torch.Tensor, text: torch.Tensor, seqs: list) -> torch.Tensor:
        """Moshi's 8 codes for each row, as the reference's `depth_decoder.generate` -> [B, 8]."""
        from transformers import DynamicCache

        depth = self.model.depth_decoder
        rows = [self._depth_row(seq) for seq in seqs]
        cache = DynamicCache(config=depth.config)
        hidden = hidden[:, None]
        ids, codes = text[:, None], []
        for _ in range(self.num_codebooks):
            out = depth(input_ids=ids, last_hidden_state=hidden, cache=cache, use_cache=True)
            code = self.depth_sampler(out.logits[:, -1].float(), rows)
            codes.append(code)
            ids = code[:, None]
        return torch.stack(codes, dim=1)

    def _depth_row(self, seq) -> _DepthRow:
        st: MoshiState = seq.model_state
        if st.depth_row is None:
            params = dataclasses.replace(seq.params, repetition_penalty=1.0, min_tokens=0, stop_token_ids=[])
            st.depth_row = _DepthRow(seq.request_id, params)
        return st.depth_row

    def release(self, seq) -> None:
        self.depth_sampler.release(seq.request_id)

    def close(self) -> None:
        self.model = self.tokenizer = None
