"""VoxCPM2's two LMs, local encoder and local DiT as one AR stage: text in, latent patches out.

What the authors' `VoxCPM2Model._inference` does per step, one engine step at a time over a
continuous batch (modeling.py holds the modules):

1. forward: the prefill reads the prompt (text ids, and a cloned clip's latent patches through
   the local encoder) into both LMs; a decode step reads the previous patch's embedding. The
   base LM's state (scalar-quantized at audio positions) and the residual LM's state
   condition the local DiT, which turns seeded noise into the next patch in `n_steps` Euler
   steps with classifier-free guidance, conditioned on the previous patch. The stop head's
   two logits (continue, stop) are the step's `logits`.
2. `on_sampled`: the patch is kept, its embedding is the next step's input, and the token is
   rewritten to the stop id (which ends the request through the engine's EOS rule) when the
   stop head says stop after more than `MIN_PATCHES` patches, or at the authors' length cap
   (6 patches per target text token + 10) — what the engine sampled from the two logits is
   not used: the authors take the argmax.

Patches go out in `TextPayload.extras["audio_codes"]` ([patches, P, D] float, CPU) with
`extras["num_new_frames"]` = 1, chunked for the VAE stage by Qwen3-Omni's `frame_chunks`;
a continuation clone adds its last prompt patches as `extras["context_codes"]`, which the VAE
decodes first and cuts, as the authors' decode.

The DiT's noise comes from a per-request generator seeded with the request's seed: one
[1, D, P] draw per step, the authors' `torch.randn` on the global generator after
`torch.manual_seed(seed)`. The authors' CLI retries an utterance that runs too long
(`retry_badcase`); the engine does not.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistage.ar.model import ARModel, ModelInput, ModelOutput, PromptInputs, sdpa_mask
from omnistage.media.audio import resample
from omnistage.models.voxcpm2.audio_vae import AudioVAEConfig, load_vae_part
from omnistage.models.voxcpm2.modeling import VoxCPM2
from omnistage.models.talker_codec.frames import FrameBuffer, frame_extras
from omnistage.models.voxcpm2.prompt import VoxPrompt, parse_prompt

AUDIO_START, REF_START, REF_END = 101, 103, 104
"""Token ids the authors' model hard-codes."""
CONTINUE, STOP = 0, 1
"""The stop head's classes, which are also the step's token ids."""
MIN_PATCHES = 2
"""The authors' `min_len`: the stop head is obeyed from the patch after this index on."""
INFERENCE_TIMESTEPS, CFG_VALUE = 10, 2.0
"""The authors' generate defaults: Euler steps per patch and the guidance scale."""
CONTEXT_PATCHES = 3
"""Continuation: prompt patches the VAE decodes before the generated ones (`streaming_prefix_len - 1`)."""


@dataclass
class VoxOutput(ModelOutput):
    patches: torch.Tensor | None = None
    """[B, P, D] this step's patch per row."""
    next_embeds: torch.Tensor | None = None
    """[B, H] each patch's LM input for the next step."""


@dataclass
class TalkerState:
    feats: torch.Tensor | None
    """[T, P, D] the prompt's patches (zero at text positions); dropped after the prefill."""
    audio_mask: torch.Tensor | None
    """[T] bool: positions that are audio patches, not text."""
    prev_patch: torch.Tensor
    """[P, D] the DiT's condition: the last patch (the prompt's last position at first)."""
    max_patches: int
    context: torch.Tensor | None = None
    """[<= 3, P, D] continuation: the prompt patches the VAE decodes first."""
    generator: torch.Generator | None = None
    next_embed: torch.Tensor | None = None
    patches: FrameBuffer | None = None
    """The generated patches ([P, D] CPU float each)."""


class VoxCPM2Talker(ARModel):
    tokenizer = None  # emits latent patches, not text
    eos_token_ids = (STOP,)

    def __init__(self, model: VoxCPM2, config: dict, tokenizer, encoder, device: torch.device) -> None:
        self.model = model
        self.text_tokenizer = tokenizer
        self.encoder = encoder
        """The audio VAE's encoder (a clip to clone -> latents)."""
        self.vae_config = AudioVAEConfig.from_dict(config.get("audio_vae_config"))
        self.device = device
        lm = model.lm_config
        self.num_layers = model.num_cache_layers
        self.kv_dims = (lm.num_key_value_heads, lm.head_dim)
        self.max_position_embeddings = lm.max_position_embeddings
        self.patch_size, self.feat_dim = model.patch_size, model.feat_dim
        # One step makes one patch of latent frames: deadline order counts its audio.
        self.audio_frame_rate = self.vae_config.out_sample_rate / (self.patch_size * self.vae_config.decode_hop_length)
        # Multi-character Chinese tokens are split into characters (the authors' tokenizer wrapper).
        self.multichar = {t for t in tokenizer.get_vocab() if len(t) >= 2 and all("\u4e00" <= c <= "\u9fff" for c in t)}

    @classmethod
    def load(cls, model_path: str, stage, device: torch.device, dtype: torch.dtype) -> VoxCPM2Talker:
        from safetensors.torch import load_file
        from transformers import LlamaTokenizerFast

        folder = Path(model_path)
        config = json.loads((folder / "config.json").read_text())
        model = VoxCPM2(config)
        model.load_state_dict(load_file(folder / "model.safetensors"), strict=True)
        tokenizer = LlamaTokenizerFast.from_pretrained(model_path)
        encoder = load_vae_part(folder, AudioVAEConfig.from_dict(config.get("audio_vae_config")), "encoder", device)
        return cls(model.to(device=device, dtype=dtype).eval(), config, tokenizer, encoder, device)

    @property
    def vocab_size(self) -> int | None:
        return self.model.lm_config.vocab_size

    # --- prompt -------------------------------------------------------------------------------

    def tokenize(self, text: str) -> list[int]:
        tokens = []
        for token in self.text_tokenizer.tokenize(text):
            clean = token.replace("\u2581", "")
            tokens.extend(clean if clean in self.multichar else [token])
        return self.text_tokenizer.convert_tokens_to_ids(tokens)

    @torch.inference_mode()
    def build_prompt(self, inputs: Any) -> PromptInputs:
        """The authors' `_generate_with_prompt_cache` layouts:
            zero-shot        text, audio_start
            reference        ref_start, clip patches, ref_end, text, audio_start
            ref_continuation ref_start, clip patches, ref_end, ref_text + text, audio_start, clip patches
        """
        prompt = parse_prompt(inputs)
        p, d = self.patch_size, self.feat_dim
        text_ids = self.tokenize(prompt.ref_text + prompt.text) + [AUDIO_START]
        ids, feats, mask = [], [], []

        def add(tokens: list[int], patches: torch.Tensor | None = None) -> None:
            ids.extend(tokens)
            feats.append(torch.zeros(len(tokens), p, d) if patches is None else patches)
            mask.extend([patches is not None] * len(tokens))

        prompt_patches = None
        if prompt.mode != "zero_shot":
            ref = self._encode_clip(prompt, pad_left=False)
            add([REF_START]), add([0] * ref.shape[0], ref), add([REF_END])
        add(text_ids)
        if prompt.mode == "ref_continuation":
            prompt_patches = self._encode_clip(prompt, pad_left=True)
            add([0] * prompt_patches.shape[0], prompt_patches)
        feats_t = torch.cat(feats)
        max_patches = int(len(self.tokenize(prompt.text)) * 6.0 + 10)  # the authors' retry_badcase_ratio_threshold
        state = TalkerState(feats_t, torch.tensor(mask), feats_t[-1].clone(), max_patches,
                            context=None if prompt_patches is None else prompt_patches[-CONTEXT_PATCHES:].clone(),
                            patches=FrameBuffer((p, d), torch.float32))
        return PromptInputs(ids, state)

    def _encode_clip(self, prompt: VoxPrompt, pad_left: bool) -> torch.Tensor:
        """A clip -> its latent patches [n, P, D] (padded to whole patches: on the left for the
        continuation prompt, on the right for the reference)."""
        c = self.vae_config
        audio = torch.from_numpy(resample(prompt.ref_audio, prompt.ref_sample_rate, c.sample_rate))
        patch_len = self.patch_size * c.hop_length
        pad = -audio.shape[0] % patch_len
        audio = torch.nn.functional.pad(audio, (pad, 0) if pad_left else (0, pad))
        latents = self.encoder(audio[None, None].to(self.device))[0].cpu()  # [D, steps]
        return latents.view(c.latent_dim, -1, self.patch_size).permute(1, 2, 0).contiguous()

    # --- forward --------------------------------------------------------------------------------

    def forward(self, batch: ModelInput, cache) -> ModelOutput:
        m = self.model
        states: list[TalkerState] = [s.model_state for s in batch.seqs]
        mask = sdpa_mask(batch)
        dtype = next(m.parameters()).dtype
        if batch.is_prefill:
            for seq, st in zip(batch.seqs, states):
                seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(63)
                st.generator = torch.Generator().manual_seed(seed)
            b, t = batch.input_ids.shape
            feats = torch.zeros(b, t, self.patch_size, self.feat_dim, dtype=dtype, device=self.device)
            is_audio = torch.zeros(b, t, dtype=torch.bool, device=self.device)
            for i, st in enumerate(states):
                n = st.feats.shape[0]
                feats[i, :n], is_audio[i, :n] = st.feats.to(self.device, dtype), st.audio_mask.to(self.device)
                st.feats = st.audio_mask = None
            feat_embed = torch.zeros(b, t, m.lm_config.hidden_size, dtype=dtype, device=self.device)
            if is_audio.any():  # only audio positions go through the local encoder (the rest are masked out)
                feat_embed[is_audio] = m.embed_patches(feats[is_audio][None])[0]
            audio = is_audio[..., None]
            embeds = torch.where(audio, feat_embed, m.embed_text(batch.input_ids))
            hidden = m.base_lm(embeds, batch.positions, cache, mask)
            hidden = torch.where(audio, m.fsq_layer(hidden), hidden)
            residual = m.residual_lm(m.fusion_concat_proj(torch.cat([hidden, feat_embed], dim=-1)),
                                     batch.positions, cache, mask)
            rows = torch.arange(b, device=self.device)
            lm_hidden, residual_hidden = hidden[rows, batch.last_indices], residual[rows, batch.last_indices]
        else:
            embeds = torch.stack([st.next_embed for st in states])[:, None]
            lm_hidden = m.fsq_layer(m.base_lm(embeds, batch.positions, cache, mask))
            residual_hidden = m.residual_lm(m.fusion_concat_proj(torch.cat([lm_hidden, embeds], dim=-1)),
                                            batch.positions, cache, mask)[:, 0]
            lm_hidden = lm_hidden[:, 0]
        noise = torch.cat([torch.randn(1, self.feat_dim, self.patch_size, generator=st.generator, dtype=dtype)
                           for st in states]).to(self.device)
        prev = torch.stack([st.prev_patch.to(self.device, dtype) for st in states])
        patches = m.next_patch(lm_hidden, residual_hidden, prev, noise, INFERENCE_TIMESTEPS, CFG_VALUE)
        next_embeds = m.embed_patches(patches[:, None])[:, 0]
        return VoxOutput(logits=m.stop_logits(lm_hidden).float(), patches=patches, next_embeds=next_embeds)

    def on_sampled(self, batch: ModelInput, output: VoxOutput, token_ids: torch.Tensor) -> list[dict]:
        wants_stop = (output.logits.argmax(dim=-1) == STOP).tolist()
        patches = output.patches.float().cpu()
        extras = []
        for i, seq in enumerate(batch.seqs):
            st: TalkerState = seq.model_state
            index = st.patches.num_frames
            st.patches.add(patches[i])
            st.prev_patch, st.next_embed = output.patches[i], output.next_embeds[i]
            stop = (index > MIN_PATCHES and wants_stop[i]) or st.patches.num_frames >= st.max_patches
            token_ids[i] = STOP if stop else CONTINUE
            extras.append(frame_extras(st.patches, 1, st.context))
        return extras

    def close(self) -> None:
        self.model = self.text_tokenizer = self.encoder = None
