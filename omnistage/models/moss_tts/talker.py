"""MOSS-TTS's backbone as one AR stage: text in, 32-codebook frames out (the delay pattern).

What the authors' `moss_tts_lite.generate.generate` does per step, one engine step at a time
over a continuous batch:

1. forward: the prefill reads the prompt's text ids (every codebook input at the padding
   code); a decode step reads the previous step's row, its text token and 32 codes summed.
   The text head's and the 32 codebook heads' logits ride along in the output.
2. `on_sampled` runs the authors' per-step rules on the request's own state (`DelayState`):
   the text token is sampled (at text temperature 1.5, top-k 50, the authors' defaults)
   while the audio has not begun its delay ramp: first `<|audio_start|>`, then one
   `gen_slot` per frame until a `delay_slot`, never `<|im_end|>` in the first 33 steps;
   during the 32-step ramp the text is `delay_slot`, then `<|audio_end|>`; `<|im_end|>` ends
   the request (the engine's EOS rule). Codebook c is sampled once the audio is c + 1 steps
   old and until the ramp passes it, with the request's temperature / top-k / top-p /
   repetition penalty (the authors' audio sampling). Temperature 0 is the authors' greedy.
   What the engine sampled from `logits` is replaced by that text token.

Frames: row r's codebook c belongs to frame r - c, so frame f is complete at row f + 31;
the frames go out in `TextPayload.extras["audio_codes"]` ([frames, 32] CPU long) with
`extras["num_new_frames"]`, for the codec stage. Padding frames (before, between and after
audio blocks) are dropped, except one all-padding frame before a later block's first frame
when a reply has more than one: the codec restarts its stream there, as the authors decode
each block on its own.

Draws come from a per-request generator seeded with the request's seed, in the authors'
order (text, codebook 0, the other codebooks), so codes equal theirs for the same seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.models.moss_tts.codec import CODEC_FOLDER
from omnistage.models.moss_tts.modeling import AUDIO_PAD_CODE, N_VQ, MossTTSBackbone
from omnistage.models.moss_tts.prompt import parse_prompt
from omnistage.models.moss_tts.sampling import repetition_penalty, sample
from omnistage.models.talker_codec.frames import FrameBuffer, frame_extras

PAD, IM_END = 151643, 151645
AUDIO_START, AUDIO_END, GEN_SLOT, DELAY_SLOT = 151652, 151653, 151656, 151662
"""Token ids the authors' model hard-codes (Qwen3's vocabulary)."""
TEXT_TEMPERATURE, TEXT_TOP_K, TEXT_TOP_P = 1.5, 50, 1.0
"""The authors' text sampling defaults."""
RAMP_OFF = None
"""`DelayState.delayed`: the delay ramp has not started (the authors' INT64_MAX)."""


@dataclass
class MossOutput(ModelOutput):
    text_logits: torch.Tensor | None = None
    """[B, V] the text head's logits."""
    code_logits: torch.Tensor | None = None
    """[B, 32, 1025] the codebook heads' logits, the padding code at -inf."""


@dataclass
class DelayState:
    generator: torch.Generator | None = None
    step: int = 0
    is_audio: bool = False
    audio_length: int = 0
    delayed: int | None = RAMP_OFF
    """Steps into the delay ramp (0 .. 32), or RAMP_OFF."""
    rows: list[torch.Tensor] = field(default_factory=list)
    """Every generated row's 32 codes (CPU long), for the frames and the repetition penalty."""
    last_codes: torch.Tensor | None = None
    frames: FrameBuffer = field(default_factory=lambda: FrameBuffer((N_VQ,)))
    """The frames that go out ([32] CPU long each): no padding frames but a block break."""
    in_gap: bool = False
    """Padding frames came after audio frames: the next audio frame starts a new block."""

    def add_row(self, codes: torch.Tensor) -> int:
        """Keep a generated row [32]; returns 1 when it completes a frame that goes out."""
        self.rows.append(codes)
        if len(self.rows) < N_VQ:
            return 0
        first = len(self.rows) - N_VQ  # frame f's codebook c is in row f + c
        frame = torch.stack([self.rows[first + c][c] for c in range(N_VQ)])
        if bool((frame == AUDIO_PAD_CODE).all()):
            self.in_gap = self.num_frames > 0
            return 0
        added = 1
        if self.in_gap:  # a padding frame marks where the next audio block starts
            self.frames.add(torch.full_like(frame, AUDIO_PAD_CODE))
            self.in_gap, added = False, 2
        self.frames.add(frame)
        return added

    @property
    def num_frames(self) -> int:
        return self.frames.num_frames

    def codes(self) -> torch.Tensor:
        return self.frames.codes()


class MossTTSTalker(ARModel):
    tokenizer = None  # emits codec frames, not text
    eos_token_ids = (IM_END,)

    def __init__(self, model: MossTTSBackbone, tokenizer, device: torch.device, max_positions: int) -> None:
        self.model = model
        self.text_tokenizer = tokenizer
        self.device = device
        self.num_layers = len(model.layers)
        self.kv_dims = (model.num_kv_heads, model.head_dim)
        self.max_position_embeddings = max_positions

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> MossTTSTalker:
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        folder = Path(model_path)
        index = folder / "model.safetensors.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [
            "model.safetensors"]
        weights = {}
        for name in files:
            weights |= load_file(folder / name)
        config = json.loads((folder / "config.json").read_text())
        language = config.get("language_config") or {}
        model = MossTTSBackbone(weights, dtype).to(device).eval()
        talker = cls(model, Tokenizer.from_file(str(folder / "tokenizer.json")), device,
                     language.get("max_position_embeddings", 40960))
        # One step makes one codec frame: deadline order counts its audio.
        codec = json.loads((folder / CODEC_FOLDER / "config.json").read_text())
        talker.audio_frame_rate = codec["sampling_rate"] / codec["downsample_rate"]
        return talker

    @property
    def vocab_size(self) -> int | None:
        return self.model.text_vocab

    def build_prompt(self, inputs: Any) -> PromptInputs:
        ids = self.text_tokenizer.encode(parse_prompt(inputs).render(), add_special_tokens=False).ids
        return PromptInputs(list(ids), DelayState())

    # --- forward --------------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        m = self.model
        states: list[DelayState] = [s.model_state for s in batch.seqs]
        if batch.is_prefill:
            for seq, st in zip(batch.seqs, states):
                seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(63)
                st.generator = torch.Generator().manual_seed(seed)
            audio = torch.full((*batch.input_ids.shape, N_VQ), AUDIO_PAD_CODE, dtype=torch.long, device=self.device)
        else:
            audio = torch.stack([st.last_codes for st in states])[:, None].to(self.device)
        hidden = m(m.embed(batch.input_ids, audio), batch.positions, cache, sdpa_mask(batch))
        if batch.is_prefill:
            hidden = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            hidden = hidden[:, -1]
        text_logits = torch.nn.functional.linear(hidden, m.text_head).float()
        # The engine's sampler draws from the two audio-phase text logits only (cheap; its pick is
        # replaced in `on_sampled`, which samples the full text head as the authors).
        return MossOutput(logits=text_logits[:, [GEN_SLOT, DELAY_SLOT]], text_logits=text_logits,
                          code_logits=m.audio_logits(hidden).float())

    # --- the authors' per-step rules --------------------------------------------------------------

    def on_sampled(self, batch: ModelInput, output: MossOutput, token_ids: torch.Tensor) -> list[dict]:
        text_logits, code_logits = output.text_logits.cpu(), output.code_logits.cpu()
        extras = []
        for i, seq in enumerate(batch.seqs):
            st: DelayState = seq.model_state
            text, codes = self._step(st, seq.params, text_logits[i], code_logits[i])
            num_new = st.add_row(codes)
            st.last_codes = codes
            st.step += 1
            token_ids[i] = text
            extras.append(frame_extras(st.frames, num_new))
        return extras

    def _step(self, st: DelayState, params, text_logits: torch.Tensor, code_logits: torch.Tensor):
        """One step of the authors' loop for one request -> (text token, [32] codes)."""
        greedy = params.temperature == 0
        ramp = st.delayed
        samples_text = ramp is RAMP_OFF
        text = PAD
        if ramp is not RAMP_OFF and ramp < N_VQ:
            text = DELAY_SLOT
        elif ramp == N_VQ:
            text, st.is_audio = AUDIO_END, False
        mask = [st.audio_length > c and (ramp is RAMP_OFF or c > ramp - 1) for c in range(N_VQ)]
        if samples_text:
            text = self._sample_text(st, text_logits, greedy)
        st.is_audio |= text == AUDIO_START
        codes = torch.full((N_VQ,), AUDIO_PAD_CODE, dtype=torch.long)
        if any(mask):
            temperature = 1.0 if greedy else params.temperature
            top_k, top_p = (params.top_k if params.top_k > 0 else None), params.top_p
            logits = code_logits / temperature
            penalty = params.repetition_penalty
            history = torch.stack(st.rows) if st.rows and penalty != 1.0 else torch.zeros(0, N_VQ, dtype=torch.long)
            if mask[0]:
                ch0 = repetition_penalty(logits[0].view(1, -1), history[:, 0], penalty)
                codes[0] = sample(ch0, top_k, top_p, greedy, st.generator)[0]
            rest = [c for c in range(1, N_VQ) if mask[c]]
            if rest:
                rows = repetition_penalty(logits[rest], history[:, 1:], penalty)
                codes[rest] = sample(rows, top_k, top_p, greedy, st.generator)
        if text in (AUDIO_START, GEN_SLOT, DELAY_SLOT):
            st.audio_length += 1
        elif text == AUDIO_END:
            st.audio_length = 0
        if ramp is RAMP_OFF and text == DELAY_SLOT:
            ramp = 0
        if ramp is not RAMP_OFF:
            ramp += 1
            st.delayed = RAMP_OFF if ramp > N_VQ else ramp
        return text, codes

    def _sample_text(self, st: DelayState, logits: torch.Tensor, greedy: bool) -> int:
        if st.is_audio and greedy:  # the authors' two-way argmax (gen slot first on a tie)
            two = logits[[GEN_SLOT, DELAY_SLOT]].clone()
            if st.step == 0:
                two[1] = float("-inf")
            return GEN_SLOT if int(torch.argmax(two)) == 0 else DELAY_SLOT
        logits = logits / (1.0 if greedy else TEXT_TEMPERATURE)
        if st.is_audio:
            keep = torch.zeros_like(logits, dtype=torch.bool)
            keep[[GEN_SLOT, DELAY_SLOT]] = True
            logits = logits.masked_fill(~keep, float("-inf"))
        else:
            logits[[PAD, GEN_SLOT, DELAY_SLOT, AUDIO_END]] = float("-inf")
        if st.step == 0:
            logits[DELAY_SLOT] = float("-inf")
        if st.step <= N_VQ:
            logits[IM_END] = float("-inf")
        return int(sample(logits.view(1, -1), TEXT_TOP_K, TEXT_TOP_P, greedy, st.generator)[0])

    def close(self) -> None:
        self.model = self.text_tokenizer = None
