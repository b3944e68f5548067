"""Qwen3-TTS zoo builders, in the on-disk format of the released 12 Hz checkpoints.

A folder as the authors ship `Qwen3-TTS-12Hz-*-{CustomVoice,VoiceDesign,Base}`:

    config.json             model_type "qwen3_tts", talker_config (+ code_predictor_config),
                            speaker_encoder_config, tts_model_type, tokenizer_type, special ids
    model.safetensors       talker.* (the authors' module names); Base: speaker_encoder.* too
    generation_config.json  the sampling defaults the authors' `generate_*` read
    tokenizer files         a byte-level BPE with the Qwen specials the prompts use
    speech_tokenizer/       config.json (model_type "qwen3_tts_tokenizer_12hz": a Mimi encoder
                            config + the decoder's) and model.safetensors (decoder.*, encoder.*)

Weights are random and fp32; the authors' package (`qwen-tts`) loads the folder.

Obstacles worked around:
1. The prompt builder slices the tokenized "<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n"
   by position (3 tokens before the text, 5 after), so "assistant" must be one token as in the
   real vocabulary; the tiny BPE splits it, so it is an added token here (and "user").
2. The talker vocab is the codebook (128 codes, real 2048) plus 1024 special ids, because
   generation suppresses ids [vocab - 1024, vocab) but codec EOS; codec specials, languages
   and speakers live there, at the real ids' offsets from the codebook.
3. The speech tokenizer's codebooks are running averages (`embedding_sum / cluster_usage`)
   that start at zero: left so, the audio would not depend on the codes. They are drawn
   from the seed, as are Mimi's (CSM's obstacle).
4. The code predictor is narrower than the talker (as in the 1.7B models), so its
   `small_to_mtp_projection` is exercised; the text embedding is wider than the talker.
5. With the default 0.02-std heads the codec logits are nearly flat: greedy picks then hang on
   float rounding (thread counts, kernels), so the heads are drawn with std 1, which separates
   the top logits as a trained model's are.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.speech_models import _check_vocab
from omnistage.testing.tokenizers import build_bpe_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

QWEN3_TTS_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>",
                            "<tts_text_eod>"]
QWEN3_TTS_TEXT_VOCAB = 512
QWEN3_TTS_CODEBOOK = 128  # codes per codebook (real: 2048)
QWEN3_TTS_CODE_GROUPS = 4  # codebooks per frame (real: 16)
QWEN3_TTS_SAMPLE_RATE = 24000  # 1920 samples per frame: 12.5 frames/s
_B = QWEN3_TTS_CODEBOOK  # the real ids' base (2048)
QWEN3_TTS_CODEC = dict(codec_pad_id=_B + 100, codec_bos_id=_B + 101, codec_eos_token_id=_B + 102,
                       codec_think_id=_B + 106, codec_nothink_id=_B + 107, codec_think_bos_id=_B + 108,
                       codec_think_eos_id=_B + 109)
QWEN3_TTS_LANGUAGES = {"english": _B + 2, "chinese": _B + 7, "german": _B + 5, "beijing_dialect": _B + 26}
QWEN3_TTS_SPEAKERS = {"vivian": _B + 900, "ryan": _B + 901, "dylan": _B + 902}
QWEN3_TTS_DIALECTS = {"vivian": False, "ryan": False, "dylan": "beijing_dialect"}
QWEN3_TTS_GENERATION = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
                            subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0,
                            subtalker_temperature=0.9, max_new_tokens=8192)


def _talker_config() -> dict:
    return dict(
        vocab_size=QWEN3_TTS_CODEBOOK + 1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_act="silu", max_position_embeddings=4096,
        rms_norm_eps=1e-6, rope_theta=1000000, attention_bias=False, use_sliding_window=False,
        rope_scaling={"rope_type": "default", "mrope_section": [4, 2, 2], "interleaved": True},
        num_code_groups=QWEN3_TTS_CODE_GROUPS, text_hidden_size=96, text_vocab_size=QWEN3_TTS_TEXT_VOCAB,
        spk_id=QWEN3_TTS_SPEAKERS, spk_is_dialect=QWEN3_TTS_DIALECTS, codec_language_id=QWEN3_TTS_LANGUAGES,
        code_predictor_config=dict(
            vocab_size=QWEN3_TTS_CODEBOOK, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=1, head_dim=16, hidden_act="silu", max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_theta=1000000, attention_bias=False, use_sliding_window=False,
            num_code_groups=QWEN3_TTS_CODE_GROUPS),
        **QWEN3_TTS_CODEC,
    )


def _speech_tokenizer_config() -> dict:
    encoder = dict(model_type="mimi", sampling_rate=QWEN3_TTS_SAMPLE_RATE, hidden_size=32, num_filters=4,
                   num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], codebook_size=QWEN3_TTS_CODEBOOK,
                   codebook_dim=16, num_quantizers=8, num_semantic_quantizers=1,
                   vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=1,
                   intermediate_size=64, num_attention_heads=2, num_key_value_heads=2, sliding_window=250,
                   frame_rate=12.5, use_causal_conv=True)
    decoder = dict(codebook_size=QWEN3_TTS_CODEBOOK, codebook_dim=32, latent_dim=32, hidden_size=32,
                   num_attention_heads=2, num_key_value_heads=2, intermediate_size=64, num_hidden_layers=1,
                   max_position_embeddings=8000, rope_theta=10000, sliding_window=72, hidden_act="silu",
                   layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_quantizers=QWEN3_TTS_CODE_GROUPS,
                   upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64, attention_bias=False,
                   attention_dropout=0.0)  # the real upsampling and window
    return dict(architectures=["Qwen3TTSTokenizerV2Model"], model_type="qwen3_tts_tokenizer_12hz",
                encoder_config=encoder, decoder_config=decoder, encoder_valid_num_quantizers=QWEN3_TTS_CODE_GROUPS,
                input_sample_rate=QWEN3_TTS_SAMPLE_RATE, output_sample_rate=QWEN3_TTS_SAMPLE_RATE,
                decode_upsample_rate=1920, encode_downsample_rate=1920)


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")  # in order: speakers are listed as the config has them


def _build_speech_tokenizer(folder: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import MimiConfig, MimiModel

    from omnistage.models.qwen3_tts.modeling import MIMI_4_NAMES, CodecDecoder, codec_state_dict

    folder.mkdir()
    config = _speech_tokenizer_config()
    decoder = CodecDecoder(config["decoder_config"]).float()
    with torch.no_grad():  # obstacle 3
        for name, param in decoder.named_parameters():
            if name.endswith("_codebook.embedding_sum"):
                param.normal_()
    encoder = MimiModel(MimiConfig(**{k: v for k, v in config["encoder_config"].items() if k != "model_type"}))
    with torch.no_grad():
        for name, buffer in encoder.quantizer.named_buffers():
            if name.endswith("codebook.embed_sum"):
                buffer.copy_(torch.randn(buffer.shape))
    # The authors' encoder is Mimi without its decoder half, under transformers 4's Mimi names.
    weights = {}
    for key, value in encoder.state_dict().items():
        for new, old in MIMI_4_NAMES:
            if key.startswith(new):
                weights["encoder." + old + key[len(new):]] = value
    weights.update(codec_state_dict(decoder))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    _write_json(folder / "config.json", config)
    _write_json(folder / "preprocessor_config.json", dict(
        feature_extractor_type="EncodecFeatureExtractor", feature_size=1, sampling_rate=QWEN3_TTS_SAMPLE_RATE,
        padding_side="right", padding_value=0.0, return_attention_mask=True))


def build_qwen3_tts(out_dir: Path, size: str, seed: int, model_type: str) -> None:
    import torch
    from safetensors.torch import save_file

    from omnistage.models.qwen3_tts.modeling import Qwen3TTSTalkerModel, talker_state_dict

    tok = build_bpe_tokenizer(QWEN3_TTS_SPECIAL_TOKENS, vocab_size=448, chat_template=None, eos_token="<|im_end|>",
                              pad_token="<|endoftext|>", model_max_length=4096)
    tok.add_tokens(["assistant", "user"])  # obstacle 1
    _check_vocab(tok, QWEN3_TTS_TEXT_VOCAB)
    ids = dict(zip(QWEN3_TTS_SPECIAL_TOKENS, tok.convert_tokens_to_ids(QWEN3_TTS_SPECIAL_TOKENS)))
    talker = _talker_config()
    if model_type != "custom_voice":
        talker["spk_id"], talker["spk_is_dialect"] = {}, {}  # VoiceDesign / Base checkpoints name no speakers
    config = dict(
        architectures=["Qwen3TTSForConditionalGeneration"], model_type="qwen3_tts",
        tokenizer_type="qwen3_tts_tokenizer_12hz", tts_model_size="0b6", tts_model_type=model_type,
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"],
        tts_pad_token_id=ids["<tts_pad>"], tts_bos_token_id=ids["<tts_text_bos>"],
        tts_eos_token_id=ids["<tts_text_eod>"], assistant_token_id=tok.convert_tokens_to_ids("assistant"),
        talker_config=talker,
        speaker_encoder_config=dict(mel_dim=128, enc_dim=talker["hidden_size"], enc_channels=[32, 32, 32, 32, 96],
                                    enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1],
                                    enc_attention_channels=16, enc_res2net_scale=4, enc_se_channels=16,
                                    sample_rate=QWEN3_TTS_SAMPLE_RATE),
        transformers_version="4.57.3",
    )
    torch.manual_seed(seed)
    model = Qwen3TTSTalkerModel(talker).float()
    with torch.no_grad():  # obstacle 5
        for head in (model.codec_head, *model.code_predictor.lm_head):
            head.weight.normal_(0.0, 1.0)
    weights = talker_state_dict(model)
    if model_type == "base":  # the ECAPA-TDNN speaker encoder (transformers' Qwen2.5-Omni one: the same network)
        from types import SimpleNamespace

        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import ECAPA_TimeDelayNet

        encoder = ECAPA_TimeDelayNet(SimpleNamespace(**config["speaker_encoder_config"])).float()
        weights.update({f"speaker_encoder.{k}": v for k, v in encoder.state_dict().items()})
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", QWEN3_TTS_GENERATION)
    tok.save_pretrained(out_dir)
    _build_speech_tokenizer(out_dir / "speech_tokenizer")


def _builder(model_type: str):
    def build(out_dir: Path, size: str, seed: int) -> None:
        build_qwen3_tts(out_dir, size, seed, model_type)
    return build


register_zoo_model(ZooModel(
    name="qwen3-tts-custom-voice",
    kind="speech",
    reference_class="qwen_tts.Qwen3TTSModel",
    builder=_builder("custom_voice"),
    sizes=("tiny",),
    description="Qwen3-TTS CustomVoice (12 Hz): talker + code predictor (4 x 128 codes) + 12 Hz speech tokenizer "
                "(24 kHz), speakers vivian/ryan/dylan, fp32.",
    revision=1,  # 1: std-1 codec heads (obstacle 5)
))
register_zoo_model(ZooModel(
    name="qwen3-tts-voice-design",
    kind="speech",
    reference_class="qwen_tts.Qwen3TTSModel",
    builder=_builder("voice_design"),
    sizes=("tiny",),
    description="Qwen3-TTS VoiceDesign (12 Hz): the voice from natural-language instructions, fp32.",
    revision=1,
))
register_zoo_model(ZooModel(
    name="qwen3-tts-base",
    kind="speech",
    reference_class="qwen_tts.Qwen3TTSModel",
    builder=_builder("base"),
    sizes=("tiny",),
    description="Qwen3-TTS Base (12 Hz): voice cloning from a reference clip (ECAPA speaker encoder + Mimi "
                "encoder), fp32.",
    revision=1,
))
