"""Qwen3-ASR zoo builder (a transformers folder), in the format of the released `-hf` checkpoints.

`Qwen3ASRForConditionalGeneration.from_pretrained` loads it and `AutoProcessor.from_pretrained`
gives the `Qwen3ASRProcessor` that `apply_transcription_request` and `decode` run on: config.json
(audio encoder + Qwen3 decoder), model.safetensors, generation_config.json, tokenizer files with
the processor's named tokens (audio_token, audio_bos_token, audio_eos_token), the chat template
(chat_template.jinja) and processor_config.json (the `Qwen3ASRFeatureExtractor`: 128 mel bins,
16 kHz). Weights are fp32.

Obstacles worked around:
1. The processor reads `tokenizer.audio_token` / `audio_bos_token` / `audio_eos_token`: they are
   named extra special tokens of the tokenizer (as in the released tokenizer_config.json).
2. `<asr_text>` (between the detected language and the transcript) is an added token that is not
   special in the released vocabulary, so `decode(skip_special_tokens=True)` keeps it and the
   processor's parser finds it; the same here.
3. The released chat template always writes a system turn (the `prompt` context, maybe empty), then
   one user turn of audio placeholders, then the assistant turns (the forced-language prefill is one,
   continued with `continue_final_message`); `QWEN3_ASR_CHAT_TEMPLATE` renders the same text.
4. With transformers' default init the tied decoder repeats one token; `init_varied_decoder` (with the
   output projections at twice the gain: the audio tokens dominate this short context) makes greedy
   output depend on the context, so token parity discriminates (12 to 23 distinct tokens in 32 greedy
   steps over `asr_clips` and silence, with and without a forced language).
5. The encoder's convolutions keep std 0.02 under that init: their output is then so small that the
   sinusoidal positions added after them decide the audio embeddings, and every clip of one length
   transcribes alike. They are redrawn fan-in scaled too, so the transcript depends on the audio.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.zoo import ZooModel, register_zoo_model

# The real Qwen3-ASR specials this model uses, in their real relative order.
QWEN3_ASR_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>",
                            "<|audio_pad|>", "<timestamp>"]
QWEN3_ASR_CHAT_TEMPLATE = (  # obstacle 3
    "{%- set system = namespace(text='') -%}{%- set audio = namespace(tokens='') -%}"
    "{%- for message in messages -%}"
    "{%- if message.content is string -%}"
    "{%- if message.role == 'system' -%}{%- set system.text = system.text + message.content -%}{%- endif -%}"
    "{%- else -%}{%- for part in message.content -%}"
    "{%- if message.role == 'system' and part.type == 'text' -%}{%- set system.text = system.text + part.text -%}"
    "{%- elif part.type == 'audio' or 'audio' in part or 'audio_url' in part -%}"
    "{%- set audio.tokens = audio.tokens + '<|audio_start|><|audio_pad|><|audio_end|>' -%}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{%- endfor -%}"
    "{{- '<|im_start|>system\\n' + system.text + '<|im_end|>\\n<|im_start|>user\\n' + audio.tokens + '<|im_end|>\\n' -}}"
    "{%- for message in messages if message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}{% generation %}"
    "{%- if message.content is string -%}{{- message.content -}}{%- else -%}"
    "{%- for part in message.content if part.type == 'text' -%}{{- part.text -}}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}{% endgeneration %}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
QWEN3_ASR_SAMPLE_RATE = 16000


def _tokenizer():
    from transformers import PreTrainedTokenizerFast

    from omnistage.testing.tokenizers import build_bpe_tokenizer

    bpe = build_bpe_tokenizer(QWEN3_ASR_SPECIAL_TOKENS, vocab_size=448, chat_template=None,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok = PreTrainedTokenizerFast(  # obstacle 1
        tokenizer_object=bpe.backend_tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        padding_side="left", model_max_length=4096,
        extra_special_tokens={"audio_token": "<|audio_pad|>", "audio_bos_token": "<|audio_start|>",
                              "audio_eos_token": "<|audio_end|>"})
    tok.add_tokens(["<asr_text>"])  # obstacle 2: not special
    return tok


def build_qwen3_asr(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        Qwen3ASRConfig,
        Qwen3ASRFeatureExtractor,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )

    from omnistage.testing.decoder_init import init_varied_decoder

    tok = _tokenizer()
    endoftext, im_end, audio_pad, timestamp = tok.convert_tokens_to_ids(
        ["<|endoftext|>", "<|im_end|>", "<|audio_pad|>", "<timestamp>"])
    config = Qwen3ASRConfig(
        # The real encoder's layout (128 mel bins, 100-frame chunks, 13 positions per chunk), narrow.
        audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=64, downsample_hidden_size=16),
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         tie_word_embeddings=True),
        audio_token_id=audio_pad, timestamp_token_id=timestamp, pad_token_id=im_end, eos_token_id=[endoftext, im_end])
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(config).float().eval()
    init_varied_decoder(model, seed, final_norm="model.language_model.norm", out_gain=2.0)  # obstacle 4
    _init_convs(model.model.audio_tower, seed)  # obstacle 5
    # As the released generation_config.json: greedy, up to 512 new tokens.
    model.generation_config = GenerationConfig(eos_token_id=[endoftext, im_end], pad_token_id=im_end,
                                               do_sample=False, max_new_tokens=512)
    model.save_pretrained(out_dir, safe_serialization=True)
    Qwen3ASRProcessor(feature_extractor=Qwen3ASRFeatureExtractor(sampling_rate=QWEN3_ASR_SAMPLE_RATE), tokenizer=tok,
                      chat_template=QWEN3_ASR_CHAT_TEMPLATE).save_pretrained(out_dir)


def _init_convs(module, seed: int) -> None:
    import math

    import torch

    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for conv in (m for m in module.modules() if isinstance(m, torch.nn.Conv2d)):
            conv.weight.normal_(0.0, 1.0 / math.sqrt(conv.weight[0].numel()), generator=g)


register_zoo_model(ZooModel(
    name="qwen3-asr",
    kind="ar",
    reference_class="transformers.Qwen3ASRForConditionalGeneration",
    builder=build_qwen3_asr,
    sizes=("tiny",),
    description="Qwen3-ASR: audio encoder (128 mel bins, 1 layer) + Qwen3 decoder (2 layers), its processor and "
                "chat template, fp32.",
))


def asr_clips(seconds: tuple[float, ...] = (1.0, 1.5)) -> list:
    """Deterministic 16 kHz float32 clips, one per length, unlike each other: a rising chirp, then
    bursts of noise, then a falling chirp, and so on (what the ASR tests and benchmark send)."""
    import numpy as np

    clips = []
    for i, s in enumerate(seconds):
        t = np.arange(int(s * QWEN3_ASR_SAMPLE_RATE)) / QWEN3_ASR_SAMPLE_RATE
        noise = np.random.default_rng(i).standard_normal(t.shape)
        if i % 2:
            clip = 0.4 * noise * (np.sin(2 * np.pi * 3 * t) > 0)
        else:
            clip = 0.3 * np.sin(2 * np.pi * (300 + (400 if i % 4 else -100) * t) * t) + 0.02 * noise
        clips.append(clip.astype(np.float32))
    return clips
