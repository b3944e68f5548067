"""Qwen3-Omni zoo builder (a transformers folder), in the format of the released checkpoint.

`Qwen3OmniMoeForConditionalGeneration.from_pretrained` loads it and runs `generate` on it:
an MoE thinker (text, audio and vision encoders), an MoE talker with its multi-codebook
code predictor, and the causal code2wav decoder (24 kHz). Weights are fp32.

Obstacles worked around (as for Qwen2.5-Omni in speech_models.py):
1. `get_rope_index` reads `thinker_config.vision_start_token_id` and `talker_config.spatial_merge_size`,
   which are not declared fields; both are put into the config so they land in config.json.
2. The talker feeds its last hidden state straight into the code predictor: their hidden sizes match.
3. `generate` suppresses the talker ids [vocab - 1024, vocab) but codec EOS, so the talker vocab is
   the codebook (256 codes) plus 1024 special ids, and the codec specials and speakers live there.
4. M-RoPE: `mrope_section` (interleaved T/H/W) must cover head_dim / 2 = 8 frequencies.
5. `Qwen3OmniMoeProcessor` cannot be built without torchvision (its video processor): we save the
   tokenizer (chat template included) and a `WhisperFeatureExtractor(feature_size=128)` for audio.
6. The role words are single tokens in the real vocabulary (the talker keeps only the user turns);
   the tiny BPE splits them, so they are added tokens here.
7. The talker's MoE experts are not initialised by `post_init` (uninitialised memory): the builder
   draws them from the seed.
8. Image input goes through `Qwen2VLImageProcessorPil` (the PIL/numpy path, no torchvision), which
   reads its fields from the same preprocessor_config.json as the feature extractor.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.speech_models import _check_vocab, _save
from omnistage.testing.tokenizers import build_bpe_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

# The real Qwen3-Omni specials this model uses, in their real relative order.
QWEN3_OMNI_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
    "<|video_pad|>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<|audio_pad|>",
]
# The real template's media parts (no default system prompt).
QWEN3_OMNI_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'audio' or 'audio' in part or 'audio_url' in part %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif part['type'] == 'image' or 'image' in part or 'image_url' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN3_OMNI_TEXT_VOCAB = 512
QWEN3_OMNI_CODEBOOK = 256  # codes per codebook (real: 2048)
QWEN3_OMNI_CODE_GROUPS = 4  # codebooks per frame (real: 16)
QWEN3_OMNI_TALKER_VOCAB = QWEN3_OMNI_CODEBOOK + 1024  # obstacle 3
QWEN3_OMNI_CODEC = dict(codec_pad_id=356, codec_bos_id=357, codec_eos_token_id=358, codec_nothink_id=363,
                        codec_think_bos_id=364, codec_think_eos_id=365)
QWEN3_OMNI_SPEAKERS = {"chelsie": 400, "ethan": 401, "aiden": 402}
QWEN3_OMNI_SAMPLE_RATE = 24000  # code2wav: 1920 samples per frame (upsampling 2 x 2 x 8 x 5 x 4 x 3), 12.5 frames/s
QWEN3_OMNI_AUDIO_IN_SAMPLE_RATE = 16000


def _qwen3_omni_config(tok):
    from transformers import Qwen3OmniMoeConfig

    ids = dict(zip(QWEN3_OMNI_SPECIAL_TOKENS, tok.convert_tokens_to_ids(QWEN3_OMNI_SPECIAL_TOKENS)))
    words = {}
    for word in ("user", "assistant", "system"):
        pieces = tok.encode(word)
        if len(pieces) != 1:
            raise ValueError(f"the zoo tokenizer splits {word!r} into {pieces}; the talker needs it as one token")
        words[word] = pieces[0]
    media = dict(audio_token_id=ids["<|audio_pad|>"], image_token_id=ids["<|image_pad|>"],
                 video_token_id=ids["<|video_pad|>"], audio_start_token_id=ids["<|audio_start|>"],
                 vision_start_token_id=ids["<|vision_start|>"])  # obstacle 1
    mrope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2], "interleaved": True,
             "mrope_interleaved": True}  # obstacle 4
    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    thinker = dict(
        text_config=dict(vocab_size=QWEN3_OMNI_TEXT_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         rope_parameters=mrope, **moe),
        audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=64,
                          d_model=32, output_dim=64, downsample_hidden_size=16),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           patch_size=16, spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[0],
                           num_position_embeddings=64),
        user_token_id=words["user"], position_id_per_seconds=25, **media,
    )
    talker = dict(
        text_config=dict(vocab_size=QWEN3_OMNI_TALKER_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         rope_parameters=mrope, shared_expert_intermediate_size=64, **moe),
        code_predictor_config=dict(vocab_size=QWEN3_OMNI_CODEBOOK, hidden_size=64,  # == talker hidden: obstacle 2
                                   intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=16, num_code_groups=QWEN3_OMNI_CODE_GROUPS,
                                   max_position_embeddings=64),
        num_code_groups=QWEN3_OMNI_CODE_GROUPS, thinker_hidden_size=64, accept_hidden_layer=1,
        speaker_id=QWEN3_OMNI_SPEAKERS, spatial_merge_size=2, position_id_per_seconds=25,
        **QWEN3_OMNI_CODEC, **media,
    )
    code2wav = dict(codebook_size=QWEN3_OMNI_CODEBOOK, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                    intermediate_size=64, num_hidden_layers=1, num_quantizers=QWEN3_OMNI_CODE_GROUPS, decoder_dim=64,
                    sliding_window=72)  # the real upsampling (8, 5, 4, 3) x (2, 2) and window
    return Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True,
        im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"], tts_pad_token_id=ids["<tts_pad>"],
        tts_bos_token_id=ids["<tts_text_bos>"], tts_eos_token_id=ids["<tts_text_eod>"],
        system_token_id=words["system"], user_token_id=words["user"], assistant_token_id=words["assistant"],
    )


def build_qwen3_omni(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3OmniMoeForConditionalGeneration, WhisperFeatureExtractor

    tok = build_bpe_tokenizer(QWEN3_OMNI_SPECIAL_TOKENS, vocab_size=448, chat_template=QWEN3_OMNI_CHAT_TEMPLATE,
                              eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=4096)
    # The talker finds chat turns by their role token (`user_token_id`, `assistant_token_id`), one token
    # each in the real vocabulary; the tiny BPE splits them, so they are added whole (obstacle 6).
    tok.add_tokens(["user", "assistant", "system"])
    _check_vocab(tok, QWEN3_OMNI_TEXT_VOCAB)
    config = _qwen3_omni_config(tok)
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(config).float().eval()
    # The talker's fused experts are created with torch.empty and no _init_weights covers them
    # (obstacle 7): left so they are whatever memory held, which changes from run to run.
    with torch.no_grad():
        for name, param in model.talker.model.named_parameters():
            if ".mlp.experts." in name:
                param.normal_(0.0, config.talker_config.initializer_range)
    endoftext, im_end = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])
    _save(out_dir, model, tok, GenerationConfig(eos_token_id=[im_end, endoftext], pad_token_id=endoftext))
    WhisperFeatureExtractor(feature_size=128, sampling_rate=QWEN3_OMNI_AUDIO_IN_SAMPLE_RATE, chunk_length=300,
                            return_attention_mask=True).save_pretrained(out_dir)
    _add_image_processor(out_dir / "preprocessor_config.json", config.thinker_config.vision_config)


def _add_image_processor(path: Path, vision) -> None:
    """The image processor's fields next to the feature extractor's in preprocessor_config.json, as in
    the real checkpoint (16-pixel patches, mean/std 0.5); read by `Qwen2VLImageProcessorPil` (obstacle 8)."""
    import json

    config = json.loads(path.read_text())
    config.update(image_processor_type="Qwen2VLImageProcessor", min_pixels=3136, max_pixels=12845056,
                  patch_size=vision.patch_size, temporal_patch_size=vision.temporal_patch_size,
                  merge_size=vision.spatial_merge_size, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


register_zoo_model(ZooModel(
    name="qwen3-omni",
    kind="omni",
    reference_class="transformers.Qwen3OmniMoeForConditionalGeneration",
    builder=build_qwen3_omni,
    sizes=("tiny",),
    description="Qwen3-Omni MoE thinker + MoE talker (4 x 256 codes) + code2wav (24 kHz), voices chelsie/ethan/aiden, "
                "fp32.",
))


# What `generate` needs on the tiny model, greedy everywhere (see speech_models.DEFAULT_GENERATE_KWARGS).
QWEN3_OMNI_GENERATE_KWARGS = dict(
    speaker="Ethan",
    thinker_max_new_tokens=16,
    thinker_do_sample=False,
    talker_max_new_tokens=32,
    talker_do_sample=False,
    talker_repetition_penalty=1.0,
)
