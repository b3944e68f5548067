"""Fish Speech's dual-AR transformer as one AR stage: text in, frames of codebook codes out.

What the authors' `generate` / `decode_one_token_ar` does per step, one engine step at a time
over a continuous batch:

1. forward (slow): the prefill reads the prompt's text ids (every codebook at code 0, which
   counts on semantic tokens only); a decode step reads the previous frame, its semantic token
   and its codes. The token logits and the last pre-norm hidden state ride along.
2. `on_sampled`: per request, the semantic token is drawn from the whole vocabulary (the
   authors' sampler, sampling.py; as theirs, its penalty reads the window's oldest frame,
   `previous_tokens[:, 0]`, and codebook k's the window's codebook k); its code is
   codebook 0 (token - first semantic id, clamped into the codebook); then the fast
   transformer, batched across the requests, reads the hidden state and each code in turn
   and codebooks 1.. are drawn the same way. `<|im_end|>` ends the request (the engine's EOS
   rule); what the engine sampled from `logits` is replaced by the drawn token.

Frames go out as `extras["audio_codes"]` ([frames, num_codebooks] CPU long) with
`extras["num_new_frames"]` (talker_codec.frames); the `<|im_end|>` step adds none.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.core.errors import RequestError, RequestErrors
from omnistage.models.fish_speech.codec import RELEASED_FRAME_RATE
from omnistage.models.fish_speech.modeling import DualAR, DualARConfig
from omnistage.models.fish_speech.prompt import FishTokenizer, parse_prompt, prompt_ids
from omnistage.models.fish_speech.sampling import penalty_window, sample
from omnistage.models.talker_codec.frames import FrameBuffer, frame_extras

RESIDUAL_CODEBOOK_SIZE = 1024
"""Codes past codebook 0 come from the codec's residual codebooks of 1024 entries (the authors'
modded DAC, `quantizer.codebook_size`): the fast logits are cut there, as the authors'."""


@dataclass
class FishOutput(ModelOutput):
    hidden: torch.Tensor | None = None
    """[B, dim] the slow transformer's last pre-norm hidden state (the fast transformer's input)."""
    token_logits: torch.Tensor | None = None
    """[B, V] the token logits as the model made them (the engine's sampler penalises `logits` in place)."""


@dataclass
class FrameState:
    generator: torch.Generator | None = None
    rows: list[torch.Tensor] = field(default_factory=list)
    """Every generated step's [1 + codebooks] ids (token, codes), for the penalty window."""
    frames: FrameBuffer | None = None


class FishSpeechTalker(ARModel):
    tokenizer = None  # emits codec frames, not text

    def __init__(self, model: DualAR, tokenizer: FishTokenizer, device: torch.device) -> None:
        self.model, self.text_tokenizer, self.device = model, tokenizer, device
        c = model.config
        self.eos_token_ids = (tokenizer.im_end_id,)
        self.num_layers, self.kv_dims = c.n_layer, (c.n_local_heads, c.head_dim)
        self.max_position_embeddings = c.max_seq_len
        self.audio_frame_rate = RELEASED_FRAME_RATE

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> FishSpeechTalker:
        folder = Path(model_path)
        config = DualARConfig.from_json(json.loads((folder / "config.json").read_text()))
        weights = torch.load(folder / "model.pth", map_location="cpu", mmap=True, weights_only=True)
        weights = weights.get("state_dict", weights)
        # A training checkpoint's names carry the Lightning module's "model." prefix (the authors drop it too).
        weights = {k.removeprefix("model."): v for k, v in weights.items()}
        return cls(DualAR(config, weights, dtype).to(device).eval(), FishTokenizer(folder), device)

    def check_params(self, params) -> None:
        """The authors' sampler reads temperature, top-p and the repetition penalty only; the
        talker draws every token itself, so the engine's other rules would not apply either."""
        ignored = {"top_k": params.top_k not in (0, -1), "min_p": params.min_p != 0.0,
                   "min_tokens": params.min_tokens != 0, "logprobs": params.logprobs is not None,
                   "structured_outputs": params.structured_outputs is not None}
        bad = [RequestError(name, f"Fish Speech samples as its authors do (temperature, top_p, "
                                  f"repetition_penalty): {name} is not supported") for name, on in ignored.items() if on]
        if len(bad) == 1:
            raise bad[0]
        if bad:
            raise RequestErrors(bad)

    @property
    def vocab_size(self) -> int | None:
        return self.model.config.vocab_size

    def build_prompt(self, inputs: Any) -> PromptInputs:
        ids = prompt_ids(self.text_tokenizer, parse_prompt(inputs))
        return PromptInputs(ids, FrameState(frames=FrameBuffer((self.model.config.num_codebooks,))))

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        m, n = self.model, self.model.config.num_codebooks
        states: list[FrameState] = [s.model_state for s in batch.seqs]
        if batch.is_prefill:
            for seq, st in zip(batch.seqs, states):
                seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(63)
                st.generator = torch.Generator().manual_seed(seed)
            codes = torch.zeros((*batch.input_ids.shape, n), dtype=torch.long, device=self.device)
        else:
            codes = torch.stack([st.rows[-1][1:] for st in states])[:, None].to(self.device)
        x = m.embed(batch.input_ids, codes, self.text_tokenizer.semantic_range)
        hidden = m(x, batch.positions, cache, sdpa_mask(batch))
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        hidden = hidden[rows, batch.last_indices] if batch.is_prefill else hidden[:, -1]
        logits = m.token_logits(hidden).float()
        return FishOutput(logits=logits, hidden=hidden, token_logits=logits.clone())

    def on_sampled(self, batch: ModelInput, output: FishOutput, token_ids: torch.Tensor) -> list[dict]:
        m, c = self.model, self.model.config
        begin = self.text_tokenizer.semantic_range[0]
        states: list[FrameState] = [s.model_state for s in batch.seqs]
        params = [s.params for s in batch.seqs]
        windows = [penalty_window(st.rows, len(st.rows)) for st in states]
        logits = output.token_logits.cpu()
        tokens = [sample(logits[i], p.temperature, p.top_p, p.repetition_penalty,
                         None if w is None else w[:, 0], st.generator)
                  for i, (st, p, w) in enumerate(zip(states, params, windows))]
        codes = torch.tensor([min(max(t - begin, 0), c.codebook_size - 1) for t in tokens])
        frame = [codes]
        fast = m.fast_start(output.hidden)
        for k in range(1, c.num_codebooks):
            fast_logits = m.fast_step(fast, m.fast_embeddings[frame[-1].to(self.device)]).float().cpu()
            fast_logits = fast_logits[:, :RESIDUAL_CODEBOOK_SIZE]
            frame.append(torch.tensor([sample(fast_logits[i], p.temperature, p.top_p, p.repetition_penalty,
                                              None if w is None else w[k + 1], st.generator)
                                       for i, (st, p, w) in enumerate(zip(states, params, windows))]))
        frames = torch.stack(frame, dim=1)
        extras = []
        for i, st in enumerate(states):
            st.rows.append(torch.cat([torch.tensor([tokens[i]]), frames[i]]))
            token_ids[i] = tokens[i]
            is_end = tokens[i] == self.text_tokenizer.im_end_id
            if not is_end:
                st.frames.add(frames[i])
            extras.append(frame_extras(st.frames, 0 if is_end else 1))
        return extras

    def close(self) -> None:
        self.model = self.text_tokenizer = None
