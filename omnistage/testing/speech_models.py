"""AR / omni / speech zoo builders (transformers folders).

Each builder writes a random-weight checkpoint that the reference class loads with
`from_pretrained` and runs with `generate`, plus the tokenizer, chat template and
generation config it needs at run time. Weights are fp32 (the parity tests run fp32).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.decoder_init import init_varied_decoder
from omnistage.testing.tokenizers import CHATML_TEMPLATE, QWEN_SPECIAL_TOKENS, QWEN_TOOLS_TEMPLATE, build_bpe_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model


# --------------------------------------------------------------------------- helpers


def _save(out_dir: Path, model, tokenizer, generation_config=None) -> None:
    """Write model weights (fp32 safetensors), config, generation config and tokenizer."""
    model.save_pretrained(out_dir, safe_serialization=True)
    if generation_config is not None:
        generation_config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _save_speakers(speakers: dict, path: Path) -> None:
    """torch.save the speaker dict. Its zip is byte-stable for equal content: fixed 1980
    timestamps, records prefixed by the file stem, and a serialization_id derived from the
    records' sizes and CRCs (checked by the zoo determinism test)."""
    import torch

    torch.save(speakers, path)


def _check_vocab(tokenizer, limit: int) -> None:
    """The model's embedding must cover every token id the tokenizer can produce."""
    if len(tokenizer) > limit:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens but only ids below {limit} are allowed")


# --------------------------------------------------------------------------- qwen2-llm

# head_dim 64: vLLM's CPU attention accepts only head sizes in {32, 64, 80, ...}.
_QWEN2_SIZES = {
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, head_dim=64),
    "small": dict(hidden_size=512, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64),
}
QWEN2_VOCAB = 1024


def build_qwen2_llm(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = build_bpe_tokenizer(QWEN_SPECIAL_TOKENS, vocab_size=QWEN2_VOCAB, chat_template=QWEN_TOOLS_TEMPLATE,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=2048)
    _check_vocab(tok, QWEN2_VOCAB)
    endoftext, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    # Like the real Qwen2.5 instruct checkpoints: bos = pad = <|endoftext|>, the model stops on
    # <|im_end|> (chat) or <|endoftext|> (plain completion).
    config = Qwen2Config(vocab_size=QWEN2_VOCAB, max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext,
                         **_QWEN2_SIZES[size])
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).float().eval()
    init_varied_decoder(model, seed)  # greedy output varies, so token parity discriminates
    gen = GenerationConfig(bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    _save(out_dir, model, tok, gen)


register_zoo_model(ZooModel(
    name="qwen2-llm",
    kind="ar",
    reference_class="transformers.Qwen2ForCausalLM",
    builder=build_qwen2_llm,
    sizes=("tiny", "small"),
    description="Qwen2 causal LM (head_dim 64, vocab 1024), Qwen2.5's ChatML template with tools, fp32.",
    revision=2,  # 1: the chat template renders tools; 2: varied greedy output (decoder_init.py)
))


# --------------------------------------------------------------------------- qwen2.5-omni
#
# Obstacles worked around (measured while building these tiny speech checkpoints):
# 1. `Qwen2_5OmniForConditionalGeneration.from_pretrained` requires `spk_dict.pt`
#    ({speaker: {"bos_token", "cond", "ref_mel"}}), and `generate` checks the speaker even in
#    text-only mode. We write one, byte-deterministically (see `_save_speakers`).
# 2. `get_rope_index` reads `thinker_config.vision_start_token_id`, which is not a declared
#    field; we put it into the thinker config so it lands in config.json.
# 3. `mrope_section` must sum to head_dim / 2 (the default [16, 24, 24] assumes head_dim 128).
# 4. The DiT's ECAPA speaker encoder needs sum(enc_channels[1:-1]) == enc_channels[-1], and
#    look-ahead/backward layer indices below num_hidden_layers.
# 5. The DiT embeds codes with nn.Embedding(num_embeds + 1) and a random talker can emit any id
#    below its vocab, so talker vocab_size <= dit num_embeds.
# 6. `generate` hard-codes the real talker eos ids [8292, 8294] and 4096/1024 max tokens in its
#    signature; there is no checkpoint field for them, so DEFAULT_GENERATE_KWARGS carries them.
# 7. `Qwen2_5OmniProcessor` cannot be built without torchvision: we save the tokenizer (chat
#    template included) and a `WhisperFeatureExtractor(feature_size=128)` for audio input.
# 8. The tts_text_* ids live in the thinker vocab, so the talker config validator warns they are
#    "outside the vocabulary"; harmless.
# 9. Image input goes through `Qwen2VLImageProcessorPil` (the PIL/numpy path; no torchvision), which
#    reads its fields from the same preprocessor_config.json as the feature extractor, as in the real
#    checkpoint. Video has no such path: transformers 5's video processors are torchvision-only.

# The real Omni added tokens in their real order (151643.. there, 0.. here), so relative ids match.
QWEN_OMNI_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>", "<|vision_pad|>",
    "<|IMAGE|>", "<|VIDEO|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
# ChatML with the Omni media placeholders (the real template minus its default system prompt).
QWEN_OMNI_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif part['type'] == 'image' or 'image' in part or 'image_url' in part %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
OMNI_TEXT_VOCAB = 512  # thinker vocab; ids from 500 up are talker-only text tokens
OMNI_TTS_PAD, OMNI_TTS_BOS, OMNI_TTS_EOS = 500, 501, 502  # tts_text_{pad,start,end}, in the thinker vocab
OMNI_SPEAKER_BOS = {"Chelsie": 510, "Ethan": 511}  # per-speaker talker text-BOS, in the thinker vocab
OMNI_CODEC_PAD, OMNI_CODEC_BOS, OMNI_CODEC_EOS, OMNI_CODEC_MASK = 128, 129, 130, 131  # codes 0..127 are audio
OMNI_TALKER_VOCAB = 136  # == DiT num_embeds (obstacle 5)
OMNI_HIDDEN = 64  # thinker hidden == talker embedding_size
OMNI_SAMPLE_RATE = 24000  # not in the config: prod(upsample_rates) 240 x DiT repeats 2 = 480 samples/code, 50 codes/s
OMNI_AUDIO_IN_SAMPLE_RATE = 16000  # WhisperFeatureExtractor input rate


def _omni_config(tok):
    from transformers import Qwen2_5OmniConfig

    ids = dict(zip(QWEN_OMNI_SPECIAL_TOKENS, tok.convert_tokens_to_ids(QWEN_OMNI_SPECIAL_TOKENS)))
    media_ids = dict(audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
                     video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
                     audio_end_token_id=ids["<|audio_eos|>"], vision_start_token_id=ids["<|vision_bos|>"],
                     vision_end_token_id=ids["<|vision_eos|>"])
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}  # sums to head_dim/2 = 8
    thinker = dict(
        text_config=dict(vocab_size=OMNI_TEXT_VOCAB, hidden_size=OMNI_HIDDEN, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, rope_parameters=mrope, tie_word_embeddings=False,
                         eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]),
        audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=OMNI_HIDDEN, n_window=100, max_source_positions=1500),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=OMNI_HIDDEN,
                           fullatt_block_indexes=[0], patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           window_size=112, in_channels=3),
        user_token_id=tok.encode("user")[0], position_id_per_seconds=25, seconds_per_chunk=2,
        **media_ids,  # vision_start_token_id included: obstacle 2
    )
    talker = dict(
        vocab_size=OMNI_TALKER_VOCAB, embedding_size=OMNI_HIDDEN, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=4096, rope_parameters=mrope,
        tts_text_start_token_id=OMNI_TTS_BOS, tts_text_end_token_id=OMNI_TTS_EOS, tts_text_pad_token_id=OMNI_TTS_PAD,
        tts_codec_start_token_id=OMNI_CODEC_BOS, tts_codec_end_token_id=OMNI_CODEC_EOS,
        tts_codec_pad_token_id=OMNI_CODEC_PAD, tts_codec_mask_token_id=OMNI_CODEC_MASK,
        spatial_merge_size=2, **media_ids,
    )
    token2wav = dict(
        dit_config=dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=16, ff_mult=2,
                        emb_dim=32, repeats=2, num_embeds=OMNI_TALKER_VOCAB, mel_dim=80, block_size=24,
                        look_ahead_layers=[1], look_backward_layers=[0], dropout=0.0, max_position_embeddings=4096,
                        enc_emb_dim=16, enc_dim=16, enc_channels=[32, 32, 32, 64],  # 32 + 32 == 64: obstacle 4
                        enc_kernel_sizes=[5, 3, 3, 1], enc_dilations=[1, 2, 3, 1], enc_attention_channels=16,
                        enc_res2net_scale=2, enc_se_channels=16),
        bigvgan_config=dict(mel_dim=80, upsample_initial_channel=128, resblock_kernel_sizes=[3],
                            resblock_dilation_sizes=[[1, 3, 5]], upsample_rates=[5, 3, 2, 2, 2, 2],  # hop 240
                            upsample_kernel_sizes=[11, 7, 4, 4, 4, 4]),
    )
    return Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav,
                             enable_audio_output=True)


def build_qwen25_omni(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2_5OmniForConditionalGeneration, WhisperFeatureExtractor

    tok = build_bpe_tokenizer(QWEN_OMNI_SPECIAL_TOKENS, vocab_size=448, chat_template=QWEN_OMNI_CHAT_TEMPLATE,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=4096)
    _check_vocab(tok, OMNI_TTS_PAD)  # ids from 500 up are the talker's text tokens
    config = _omni_config(tok)
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(config).float().eval()
    endoftext, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    gen = GenerationConfig(eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    _save(out_dir, model, tok, gen)
    # Same settings as the real checkpoint's audio front end (128 mel bins, 16 kHz, up to 300 s).
    WhisperFeatureExtractor(feature_size=128, sampling_rate=OMNI_AUDIO_IN_SAMPLE_RATE, chunk_length=300,
                            return_attention_mask=True).save_pretrained(out_dir)
    _add_image_processor(out_dir / "preprocessor_config.json", config.thinker_config.vision_config)
    speakers = {}
    for name, bos in OMNI_SPEAKER_BOS.items():
        speakers[name] = {"bos_token": bos,
                          "cond": torch.randn(config.token2wav_config.dit_config.enc_emb_dim),
                          "ref_mel": torch.randn(1, 60, config.token2wav_config.dit_config.mel_dim)}
    _save_speakers(speakers, out_dir / "spk_dict.pt")


def _add_image_processor(path: Path, vision) -> None:
    """The real checkpoint's preprocessor_config.json holds the image processor's fields next to the
    feature extractor's (one file, two readers): add them, with the real pixel bounds (obstacle 9)."""
    import json

    config = json.loads(path.read_text())
    config.update(image_processor_type="Qwen2VLImageProcessor", min_pixels=3136, max_pixels=12845056,
                  patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                  merge_size=vision.spatial_merge_size, image_mean=[0.48145466, 0.4578275, 0.40821073],
                  image_std=[0.26862954, 0.26130258, 0.27577711])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


register_zoo_model(ZooModel(
    name="qwen2.5-omni",
    kind="omni",
    reference_class="transformers.Qwen2_5OmniForConditionalGeneration",
    builder=build_qwen25_omni,
    sizes=("tiny",),
    description="Qwen2.5-Omni thinker + talker + token2wav (24 kHz), speakers Chelsie/Ethan, fp32.",
    revision=1,  # 1: image processor fields in preprocessor_config.json
))


# --------------------------------------------------------------------------- csm
#
# No hard obstacles (reference doc, section 3). Two constraints shape the config:
# - `CsmProcessor` hard-codes the real Mimi encoder's kernels and strides to count the
#   <|AUDIO|> tokens of a context utterance, so the tiny Mimi keeps upsampling_ratios
#   [8, 6, 5, 4] and the default kernel sizes and shrinks only the widths.
# - Mimi's `upsample_groups` must divide `hidden_size`, and `codebook_size` is a power of 2.

# The Llama-3 specials CSM uses, in their real order (128000.. there, 0.. here).
CSM_SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|AUDIO|>", "<|audio_eos|>"]
# sesame/csm-1b's template without its validation: the role is the speaker id.
CSM_CHAT_TEMPLATE = (
    "{% for message in messages %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ bos_token }}[{{ message['role'] }}]{{ part['text'] }}{{ eos_token }}"
    "{% elif part['type'] == 'audio' %}<|AUDIO|><|audio_eos|>{% endif %}{% endfor %}{% endfor %}"
)
CSM_NUM_CODEBOOKS, CSM_CODEBOOK_SIZE = 8, 2048  # real: 32 x 2048
CSM_TEXT_VOCAB = 512
CSM_SAMPLE_RATE = 24000  # Mimi: 12.5 frames/s, 1920 samples per frame


def build_csm(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import CsmConfig, CsmForConditionalGeneration, CsmProcessor, EncodecFeatureExtractor

    tok = build_bpe_tokenizer(CSM_SPECIAL_TOKENS, vocab_size=448, chat_template=CSM_CHAT_TEMPLATE,
                              bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>", pad_token="<|AUDIO|>",
                              model_max_length=2048)
    _check_vocab(tok, CSM_TEXT_VOCAB)
    bos, audio, audio_eos = tok.convert_tokens_to_ids(["<|begin_of_text|>", "<|AUDIO|>", "<|audio_eos|>"])
    nq, cb = CSM_NUM_CODEBOOKS, CSM_CODEBOOK_SIZE
    config = CsmConfig(
        num_codebooks=nq, vocab_size=cb + 3, codebook_pad_token_id=cb + 2, codebook_eos_token_id=0,
        text_vocab_size=CSM_TEXT_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        bos_token_id=bos, pad_token_id=audio, audio_token_id=audio, audio_eos_token_id=audio_eos,
        depth_decoder_config=dict(num_codebooks=nq, backbone_hidden_size=64, vocab_size=cb + 3, hidden_size=32,
                                  intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=1, max_position_embeddings=nq + 1),
        codec_config=dict(model_type="mimi", sampling_rate=CSM_SAMPLE_RATE, hidden_size=32, num_filters=4,
                          num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], codebook_size=cb, codebook_dim=16,
                          num_quantizers=nq, num_semantic_quantizers=1, vector_quantization_hidden_dimension=16,
                          upsample_groups=32, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
                          num_key_value_heads=2, sliding_window=250, frame_rate=12.5),
    )
    torch.manual_seed(seed)
    model = CsmForConditionalGeneration(config).float().eval()
    # Mimi's codebooks are running averages that start at zero (no gradient trains them):
    # left so, the codec's audio would not depend on the codes at all.
    with torch.no_grad():
        for name, buffer in model.codec_model.quantizer.named_buffers():
            if name.endswith("codebook.embed_sum"):
                buffer.copy_(torch.randn(buffer.shape))
    model.save_pretrained(out_dir, safe_serialization=True)
    processor = CsmProcessor(feature_extractor=EncodecFeatureExtractor(feature_size=1, sampling_rate=CSM_SAMPLE_RATE),
                             tokenizer=tok, chat_template=CSM_CHAT_TEMPLATE)
    processor.save_pretrained(out_dir)


register_zoo_model(ZooModel(
    name="csm",
    kind="speech",
    reference_class="transformers.CsmForConditionalGeneration",
    builder=build_csm,
    sizes=("tiny",),
    description="CSM backbone + depth decoder + Mimi codec (8 x 2048 codes, 24 kHz), CsmProcessor, fp32.",
    revision=1,  # 1: random Mimi codebooks (they were all zeros)
))


# --------------------------------------------------------------------------- generate kwargs

# What a reference-library `generate` call needs on each tiny model, greedy everywhere, so
# parity tests can run the reference and omnistage with the same settings.
DEFAULT_GENERATE_KWARGS: dict[str, dict] = {
    "qwen2-llm": dict(max_new_tokens=16, do_sample=False),
    "qwen2.5-omni": dict(
        speaker="Chelsie",
        thinker_max_new_tokens=16,
        thinker_do_sample=False,
        talker_max_new_tokens=32,
        talker_do_sample=False,
        talker_repetition_penalty=1.0,
        # The signature defaults to the real model's ids [8292, 8294] (obstacle 6).
        talker_eos_token_id=[OMNI_CODEC_PAD, OMNI_CODEC_EOS],
        token2wav_num_steps=4,
    ),
    "csm": dict(max_new_tokens=8, do_sample=False, depth_decoder_do_sample=False, output_audio=True),
}
