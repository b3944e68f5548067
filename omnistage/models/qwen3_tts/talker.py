"""Qwen3-TTS's talker + code predictor as one AR stage: text in, codec frames out.

The decode loop is Qwen3-Omni's talker's (`Qwen3OmniTalker`: codebook 0 from the talker,
the other codebooks from the code predictor in `on_sampled`, the next input the frame's
summed embeddings plus the next text row); what differs is the prompt, built here as the
authors' `Qwen3TTSForConditionalGeneration.generate` builds it for one request:

    [instructions turn]  text_projection("<|im_start|>user\\n{instructions}<|im_end|>\\n")   (if any)
    role                 text_projection("<|im_start|>assistant\\n")
    codec tags           tts_pad x (n - 2), tts_bos  +  codec embeddings of
                         [nothink, think_bos, think_eos] or [think, think_bos, language, think_eos],
                         then the speaker (CustomVoice) or the clip's speaker embedding (Base),
                         codec_pad (the last, codec_bos, goes below)
    text                 non-streaming: every text token and tts_eos (+ codec_pad each), then
                         tts_pad + codec_bos; the decode steps add tts_pad
                         streaming: the first text token + codec_bos; decode step k adds text
                         token k + 1, then tts_eos, then tts_pad
                         cloned in context (Base + ref_text): `_in_context`, in place of the text rows

Sampling: the talker's suppressed ids are [vocab - 1024, vocab) but codec EOS, and the
code predictor samples with top-k 50 / top-p 1.0 (the authors' subtalker defaults) at the
request's temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omnistage.ar.kv_cache import kv_dims
from omnistage.ar.model import PromptInputs
from omnistage.core.errors import RequestError
from omnistage.models.qwen3_omni.talker import NUM_SUPPRESSED, Qwen3OmniTalker, TalkerState
from omnistage.models.qwen3_tts.modeling import load_talker, read_config
from omnistage.models.qwen3_tts.prompt import parse_prompt
from omnistage.models.talker_codec.frames import FrameBuffer
from omnistage.models.talker_codec.side_sampling import SideSampler


@dataclass
class TtsTalkerState(TalkerState):
    context_codes: torch.Tensor | None = None
    """[frames, G] CPU long: a cloned voice's reference codes (in-context mode), which the codec
    decodes before the generated frames (and drops their audio), as the authors' decode."""


class Qwen3TTSTalker(Qwen3OmniTalker):
    predictor_top_k, predictor_top_p = 50, 1.0
    cloner = None
    """Base checkpoints: the speaker and speech-tokenizer encoders (cloning.VoiceCloner)."""

    def __init__(self, model, config: dict, tokenizer, device: torch.device) -> None:
        talker = config["talker_config"]
        text = model.model.config
        self.model = model
        self.config = config
        self.text_tokenizer = tokenizer  # not `tokenizer`: the stage emits codes, the engine detokenizes nothing
        self.embed = model.get_input_embeddings()
        self.predictor = model.code_predictor
        self.device = device
        self.num_layers = text.num_hidden_layers
        self.kv_dims = kv_dims(text)
        self.max_position_embeddings = text.max_position_embeddings
        self.num_code_groups = talker["num_code_groups"]
        self.codec_eos = talker["codec_eos_token_id"]
        self.codec_pad, self.codec_bos = talker["codec_pad_id"], talker["codec_bos_id"]
        self.eos_token_ids = (self.codec_eos,)
        vocab = talker["vocab_size"]
        self.suppressed = [i for i in range(max(0, vocab - NUM_SUPPRESSED), vocab) if i != self.codec_eos]
        self.speaker_ids = {name.lower(): int(i) for name, i in (talker.get("spk_id") or {}).items()}
        self.tts_ids = [config["tts_bos_token_id"], config["tts_eos_token_id"], config["tts_pad_token_id"]]
        self.predictor_sampler = SideSampler(device, top_k=self.predictor_top_k, top_p=self.predictor_top_p)

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> Qwen3TTSTalker:
        from transformers import AutoTokenizer

        model, config = load_talker(model_path, device, dtype)
        talker = cls(model, config, AutoTokenizer.from_pretrained(model_path), device)
        codec = read_config(f"{model_path}/speech_tokenizer")  # one frame: decode_upsample_rate samples
        talker.audio_frame_rate = codec["output_sample_rate"] / codec["decode_upsample_rate"]
        if config.get("tts_model_type") == "base":
            from omnistage.models.qwen3_tts.cloning import VoiceCloner

            talker.cloner = VoiceCloner(model_path, device, dtype)
        return talker

    def _ids(self, text: str) -> torch.Tensor:
        return torch.tensor(self.text_tokenizer(text)["input_ids"], dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def build_prompt(self, inputs: Any) -> PromptInputs:
        prompt = parse_prompt(inputs, self.config)
        talker = self.config["talker_config"]
        embed_text = self.model.embed_text
        ids = self._ids(f"<|im_start|>assistant\n{prompt.text}<|im_end|>\n<|im_start|>assistant\n")
        if ids.shape[0] < 9:
            raise RequestError("prompt", "prompt: the text tokenized to nothing between the chat markers")
        tts_bos, tts_eos, tts_pad = embed_text(torch.tensor(self.tts_ids, device=self.device)).unbind(0)
        if prompt.language_id is None:
            tags = [talker["codec_nothink_id"], talker["codec_think_bos_id"], talker["codec_think_eos_id"]]
        else:
            tags = [talker["codec_think_id"], talker["codec_think_bos_id"], prompt.language_id,
                    talker["codec_think_eos_id"]]
        if prompt.speaker is not None:
            tags.append(self.speaker_ids[prompt.speaker])
        codec = self.embed(torch.tensor([*tags, self.codec_pad, self.codec_bos], device=self.device))
        clone = self._clone(prompt)
        if clone is not None:  # the clip's speaker embedding stands where a speaker's codec embedding goes
            codec = torch.cat([codec[:-2], clone["speaker"].to(codec.dtype)[None], codec[-2:]])
        tag_rows = torch.cat([tts_pad.expand(codec.shape[0] - 2, -1), tts_bos[None]]) + codec[:-1]
        parts = [] if prompt.instructions is None else [
            embed_text(self._ids(f"<|im_start|>user\n{prompt.instructions}<|im_end|>\n"))]
        parts += [embed_text(ids[:3]), tag_rows]
        context = None
        if clone is not None and clone["codes"] is not None:
            context = clone["codes"]
            rows, trailing = self._in_context(prompt, ids, context, tts_pad, tts_eos)
            parts.append(rows)
        elif prompt.non_streaming:
            words = torch.cat([embed_text(ids[3:-5]), tts_eos[None]])
            pad = self.embed(torch.tensor([self.codec_pad], device=self.device))
            parts += [words + pad, (tts_pad + codec[-1])[None]]
            trailing = words[:0]
        else:
            parts.append(embed_text(ids[3:4]) + codec[-1:])
            trailing = torch.cat([embed_text(ids[4:-5]), tts_eos[None]])
        prompt_embeds = torch.cat(parts)
        length = prompt_embeds.shape[0]
        positions = torch.arange(length, device=self.device).expand(3, -1)
        state = TtsTalkerState(prompt_embeds, trailing, tts_pad, positions, 0, FrameBuffer((self.num_code_groups,)),
                               context_codes=None if context is None else context.cpu())
        return PromptInputs([self.codec_pad] * length, state)

    def _clone(self, prompt) -> dict | None:
        if prompt.ref_audio is None:
            return None
        if self.cloner is None:
            raise RequestError("ref_audio", "ref_audio: this checkpoint has no speaker encoder (not a Base checkpoint)")
        from omnistage.models.qwen3_tts.cloning import clone_inputs

        return clone_inputs(self.cloner, prompt.ref_audio, prompt.ref_sample_rate, prompt.ref_text is not None)

    def _in_context(self, prompt, ids, codes, tts_pad, tts_eos) -> tuple[torch.Tensor, torch.Tensor]:
        """The authors' `generate_icl_prompt`: the reference transcript and the text to speak over the
        clip's codes (after codec_bos); what text is left over is fed during decoding."""
        ref_ids = self._ids(f"<|im_start|>assistant\n{prompt.ref_text}<|im_end|>\n")[3:-2]
        text = torch.cat([self.model.embed_text(torch.cat([ref_ids, ids[3:-5]])), tts_eos[None]])
        tables = [self.embed, *self.predictor.get_input_embeddings()]
        codes = codes.to(self.device)
        frames = torch.stack([tables[g](codes[:, g]) for g in range(self.num_code_groups)], dim=1).sum(1)
        codec = torch.cat([self.embed(torch.tensor([self.codec_bos], device=self.device)), frames])
        if prompt.non_streaming:
            pad = self.embed(torch.tensor([self.codec_pad], device=self.device))
            return torch.cat([text + pad, codec + tts_pad]), text[:0]
        if text.shape[0] > codec.shape[0]:
            return text[:codec.shape[0]] + codec, text[codec.shape[0]:]
        text = torch.cat([text, tts_pad.expand(codec.shape[0] - text.shape[0], -1)])
        return text + codec, text[:0]

    def on_sampled(self, batch, output, token_ids):
        extras = super().on_sampled(batch, output, token_ids)
        for seq, extra in zip(batch.seqs, extras):
            if seq.model_state.context_codes is not None:
                extra["context_codes"] = seq.model_state.context_codes  # the codec decodes after them
        return extras

    def close(self) -> None:
        super().close()
        self.text_tokenizer = self.cloner = None
