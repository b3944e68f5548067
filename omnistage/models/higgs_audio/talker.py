"""Higgs-Audio v2's DualFFN Llama as one AR stage: text in, codec frames out.

What `HiggsAudioV2ForConditionalGeneration.generate` does per step, one engine step at a
time over a continuous batch:

1. forward: the prefill reads the prompt's text ids (text FFNs) and a cloned voice's clip as
   delayed codebook rows (audio FFNs; the audio tokenizer's encoder makes them in
   `build_prompt`, as the processor does); a decode step reads the
   previous step's N codes as one summed audio embedding (audio FFNs). The audio head gives
   N codebooks' logits at once, masked by the delay pattern (`_delay_mask`, as the
   reference's `HiggsAudioV2DelayPatternLogitsProcessor`). The engine's sampler picks
   codebook 0 from `logits`; `on_sampled` picks codebooks 1..N-1 with the request's
   temperature / top-k / top-p / seed (`code_sampler`).
2. `on_sampled` sets the step's text token as the reference does: `audio_delay_token_id`
   once a codebook has ended its stream (and from then on), `eos_token_id` on an all-EOS
   row (which stops the request through the engine's EOS rule), else `audio_token_id`.

Delay pattern: codebook c runs c steps behind codebook 0. The first row is all stream-BOS
(not audio), and codebook c >= k is forced to BOS at step k; after the first stream-EOS,
codebook c < d is forced to EOS at the d-th step after it. Undelayed frame j is the
diagonal `rows[j + c, c]`, complete once row j + N - 1 exists, so frames stream out one
per step after the first N rows. They go out in `TextPayload.extras["audio_codes"]`
([frames, N], CPU long, clipped to the codec's range as the processor's `batch_decode`)
with `extras["num_new_frames"]` (0 or 1), as CSM's talker. (An all-BOS row before the first
frame restarts the audio, as `batch_decode` starts after the last one; after frames have
streamed out it is kept, clipped, where `batch_decode` would drop what came before it.)

Repetition-aware sampling (the checkpoint's generation config `ras_win_len` and
`ras_win_max_num_repeat`, as the reference's `_sample`): a code already sampled that many
times in its codebook over the last `ras_win_len` rows (the clip's included; stream BOS/EOS
not counted) is redrawn from the unmasked, untempered softmax, with torch's global generator
in one draw per step as the reference, so even greedy requests vary from run to run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.media.audio import resample
from omnistage.models.higgs_audio.codec import tokenizer_folder
from omnistage.models.higgs_audio.codec_model import HiggsCodecEncoder
from omnistage.models.higgs_audio.prompt import parse_prompt
from omnistage.models.talker_codec.frames import FrameBuffer, frame_extras
from omnistage.models.talker_codec.side_sampling import SideSampler

AUDIO_PLACEHOLDER = "<|AUDIO_OUT|>"
"""The chat template's audio part; the processor expands it to one token per delayed row."""


@dataclass
class HiggsOutput(ModelOutput):
    code_logits: torch.Tensor | None = None
    """[B, N, C] every codebook's masked logits (codebook 0's are also `logits`)."""
    raw_logits: torch.Tensor | None = None
    """[B, N, C] the logits before the delay mask, when repetition-aware sampling is on."""


@dataclass
class TalkerState:
    num_codebooks: int
    prompt_audio: torch.Tensor | None = None
    """[rows, N] a cloned voice's delayed codes for the prompt's audio placeholders; dropped after prefill."""
    num_steps: int = 0
    window: list[torch.Tensor] = field(default_factory=list)
    """The last `ras_win_len` rows [N] fed to the model (the clip's, then the sampled ones), for RAS."""
    """Rows sampled so far (the first is the all-BOS row)."""
    num_delay: int = 0
    """Text tokens so far that were the delay token (codebooks c < num_delay are forced to EOS)."""
    last_text: int | None = None
    rows: list[torch.Tensor] = field(default_factory=list)
    """The last delayed rows [N] (CPU long) after the all-BOS row, fewer than N of them."""
    frames: FrameBuffer = field(init=False)
    """The undelayed, clipped frames ([N] CPU long each)."""
    last_row: torch.Tensor | None = None
    """[N] on the model's device: the next decode step's input."""

    def __post_init__(self) -> None:
        self.frames = FrameBuffer((self.num_codebooks,))


def processor_chat_template(folder: Path) -> str | None:
    """Where transformers saves a processor's template: chat_template.jinja, or in the processor's json."""
    import json

    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "processor_config.json"):
        if (folder / name).is_file():
            template = json.loads((folder / name).read_text()).get("chat_template")
            if template:
                return template
    return None


class HiggsAudioTalker(ARModel):
    tokenizer = None  # emits codec frames, not text
    supports_prepacked_linears = True  # transformers' layers only call their linears

    def __init__(self, model, tokenizer, chat_template: str, encoder, device: torch.device) -> None:
        config = model.config
        self.model = model
        self.encoder = encoder
        """The audio tokenizer's encoder (`HiggsCodecEncoder`): a reference clip -> codes."""
        self.text_tokenizer = tokenizer
        self.chat_template = chat_template
        self.device = device
        self.num_layers = config.num_hidden_layers
        self.kv_dims = kv_dims(config)
        self.max_position_embeddings = config.max_position_embeddings
        self.num_codebooks = config.num_codebooks
        self.codebook_size = config.codebook_size
        self.stream_bos = config.audio_stream_bos_id
        self.stream_eos = config.audio_stream_eos_id
        self.audio_token_id = config.audio_token_id
        self.delay_token_id = config.audio_delay_token_id
        self.eos_token_ids = (config.eos_token_id,)
        self.code_sampler = SideSampler(device)
        generation = model.generation_config
        self.ras_window = getattr(generation, "ras_win_len", None) or 0
        self.ras_max_repeat = getattr(generation, "ras_win_max_num_repeat", None) or 0

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> HiggsAudioTalker:
        from transformers import AutoTokenizer, HiggsAudioV2ForConditionalGeneration

        model = HiggsAudioV2ForConditionalGeneration.from_pretrained(model_path, dtype=dtype,
                                                                     attn_implementation="sdpa")
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        # The processor's template: the processor itself cannot be built without torchaudio,
        # which its audio tokenizer imports.
        template = processor_chat_template(Path(model_path))
        if not template:
            raise ValueError(f"{model_path}: no processor chat template (chat_template.jinja, or "
                             "processor_config.json's chat_template)")
        encoder = HiggsCodecEncoder.from_pretrained(tokenizer_folder(model_path), device)
        talker = cls(model.to(device).eval(), tokenizer, template, encoder, device)
        # One step completes one codec frame (after the delay pattern's first rows): deadline order.
        talker.audio_frame_rate = encoder.config.sample_rate / encoder.config.hop_length
        return talker

    @property
    def vocab_size(self) -> int | None:
        return self.model.config.vocab_size

    # --- prompt -------------------------------------------------------------------------------

    @torch.inference_mode()
    def build_prompt(self, inputs: Any) -> PromptInputs:
        prompt = parse_prompt(inputs)
        text = self.text_tokenizer.apply_chat_template(prompt.conversation(), chat_template=self.chat_template,
                                                       tokenize=False, add_generation_prompt=True)
        state = TalkerState(self.num_codebooks)
        if prompt.ref_audio is not None:
            state.prompt_audio = self._reference_rows(prompt.ref_audio, prompt.ref_sample_rate)
            state.window = list(state.prompt_audio.cpu()[-self.ras_window:]) if self.ras_window else []
            # As the processor: one placeholder per row, the last N-1 of them the delay token.
            n = self.num_codebooks
            delay = self.text_tokenizer.convert_ids_to_tokens(self.delay_token_id)
            text = text.replace(AUDIO_PLACEHOLDER, AUDIO_PLACEHOLDER * (state.prompt_audio.shape[0] - (n - 1))
                                + delay * (n - 1), 1)
        ids = self.text_tokenizer(text, add_special_tokens=False)["input_ids"]
        return PromptInputs(list(ids), state)

    def _reference_rows(self, clip, rate: int) -> torch.Tensor:
        """A clip -> its codes between a stream BOS and EOS, in the delay pattern: [frames + 2 + N - 1, N]
        (the processor's `build_delay_pattern`: codebook c starts c rows late, padded with BOS before
        and EOS after)."""
        audio = resample(clip, rate, self.encoder.config.sample_rate)
        codes = self.encoder(torch.from_numpy(audio)[None, None].to(self.device))[0]  # [N, frames]
        n, length = codes.shape[0], codes.shape[1] + 2
        stream = torch.cat([codes.new_full((n, 1), self.stream_bos), codes, codes.new_full((n, 1), self.stream_eos)],
                           dim=1)
        rows = codes.new_full((n, length + n - 1), self.stream_eos)
        for c in range(n):
            rows[c, :c] = self.stream_bos
            rows[c, c:c + length] = stream[c]
        return rows.T.contiguous()

    # --- forward --------------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        states: list[TalkerState] = [s.model_state for s in batch.seqs]
        if batch.is_prefill:
            inputs = {"input_ids": batch.input_ids, **self._prompt_audio(states)}
        else:
            inputs = {"audio_input_ids": torch.stack([st.last_row for st in states])[:, None]}
        out = self.model.model(**inputs, position_ids=batch.positions, attention_mask=sdpa_mask(batch), cache=cache,
                               use_cache=True)
        hidden = out.last_hidden_state
        if batch.is_prefill:
            last = hidden[torch.arange(hidden.shape[0], device=hidden.device), batch.last_indices]
        else:
            last = hidden[:, -1]
        logits = self.model.audio_lm_head(last).float().view(len(states), self.num_codebooks, self.codebook_size)
        raw = logits.clone() if self.ras_window else None
        self._delay_mask(logits, states)
        return HiggsOutput(logits=logits[:, 0], code_logits=logits, raw_logits=raw)

    def _prompt_audio(self, states: list[TalkerState]) -> dict:
        """Cloned voices' rows for the prefill's audio placeholders: `audio_input_ids` [B, rows, N]
        (padded) with `audio_input_ids_mask` [B, rows], as the processor's batch."""
        rows = [st.prompt_audio for st in states]
        for st in states:
            st.prompt_audio = None
        if all(r is None for r in rows):
            return {}
        longest = max(r.shape[0] for r in rows if r is not None)
        ids = torch.full((len(rows), longest, self.num_codebooks), self.stream_eos, dtype=torch.long,
                         device=self.device)
        mask = torch.zeros(len(rows), longest, dtype=torch.bool, device=self.device)
        for i, r in enumerate(rows):
            if r is not None:
                ids[i, :r.shape[0]], mask[i, :r.shape[0]] = r, True
        return {"audio_input_ids": ids, "audio_input_ids_mask": mask}

    def _delay_mask(self, logits: torch.Tensor, states: list[TalkerState]) -> None:
        """In place: only stream-BOS for codebooks c >= step (the delayed start), only stream-EOS
        for codebooks c < num_delay (the delayed end)."""
        n = self.num_codebooks
        for i, st in enumerate(states):
            if st.num_steps < n:
                forced = logits[i, st.num_steps:, self.stream_bos].clone()
                logits[i, st.num_steps:] = -float("inf")
                logits[i, st.num_steps:, self.stream_bos] = forced
            if st.num_delay:
                d = min(st.num_delay, n)
                forced = logits[i, :d, self.stream_eos].clone()
                logits[i, :d] = -float("inf")
                logits[i, :d, self.stream_eos] = forced

    # --- the other codebooks, the text token, the frames --------------------------------------------

    def on_sampled(self, batch: ModelInput, output: HiggsOutput, token_ids: torch.Tensor) -> list[dict]:
        b, n, c = output.code_logits.shape
        rows = [self.code_sampler.row(seq) for seq in batch.seqs for _ in range(n - 1)]
        rest = self.code_sampler(output.code_logits[:, 1:].reshape(b * (n - 1), c), rows).view(b, n - 1)
        sampled = torch.cat([token_ids[:, None], rest], dim=1)
        if self.ras_window and self.ras_max_repeat:
            self._resample_repeats(batch.seqs, output.raw_logits, sampled)
        sampled_cpu = sampled.cpu()
        extras = []
        for i, seq in enumerate(batch.seqs):
            st: TalkerState = seq.model_state
            row = sampled_cpu[i]
            is_eos = row == self.stream_eos
            text = self.audio_token_id
            if bool(is_eos.any()) or st.last_text == self.delay_token_id:
                text = self.delay_token_id
            if bool(is_eos.all()):
                text = self.eos_token_ids[0]
            num_new = self._add_row(st, row) if text != self.eos_token_ids[0] else 0
            st.num_steps += 1
            st.num_delay += text == self.delay_token_id
            st.last_text = text
            st.last_row = sampled[i]
            if self.ras_window:
                st.window = (st.window + [row])[-self.ras_window:]
            token_ids[i] = text  # the engine's stop rule sees this model's EOS id
            extras.append(frame_extras(st.frames, num_new))
        return extras

    def _resample_repeats(self, seqs: list, raw_logits: torch.Tensor, sampled: torch.Tensor) -> None:
        """In place on `sampled` [B, N]: redraw each code repeated `ras_max_repeat` times in its codebook's window."""
        replace = torch.zeros(sampled.shape, dtype=torch.bool)
        codes = sampled.cpu()
        for i, seq in enumerate(seqs):
            st: TalkerState = seq.model_state
            if st.window:
                window = torch.stack(st.window)
                counted = (window != self.stream_bos) & (window != self.stream_eos)
                replace[i] = ((window == codes[i]) & counted).sum(dim=0) >= self.ras_max_repeat
        if replace.any():
            mask = replace.to(sampled.device)
            sampled[mask] = raw_logits[mask].softmax(dim=-1).multinomial(1, replacement=True).view(-1)

    def _add_row(self, st: TalkerState, row: torch.Tensor) -> int:
        """Keep a delayed row; returns 1 when it completes an undelayed frame."""
        n = self.num_codebooks
        if bool((row == self.stream_bos).all()) and not st.frames.num_frames:
            st.rows.clear()  # the audio starts after the last all-BOS row (the processor's batch_decode)
            return 0
        st.rows.append(row)
        if len(st.rows) < n:
            return 0
        frame = torch.stack([st.rows[k][k] for k in range(n)])  # the diagonal: codebook k is k rows late
        st.rows.pop(0)
        st.frames.add(frame.clamp(0, self.stream_bos - 1))
        return 1

    def release(self, seq) -> None:
        self.code_sampler.release(seq)

    def close(self) -> None:
        self.model = self.text_tokenizer = self.encoder = None
