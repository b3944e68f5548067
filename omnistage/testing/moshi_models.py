"""Tiny Moshi (Kyutai's full-duplex speech model; PersonaPlex shares its architecture).

Written as transformers saves `MoshiForConditionalGeneration`: one config.json with the
temporal transformer, the depth decoder (`depth_decoder_config`) and the Mimi codec
(`audio_encoder_config`), one safetensors file with all three (`audio_encoder.*` is the
codec), the generation config and the text tokenizer. Sizes shrink only the widths:
Mimi keeps its real strides (24 kHz, 1920 samples = one 80 ms frame), 8 codebooks of 2048.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.tokenizers import build_bpe_tokenizer
from omnistage.testing.zoo import ZooModel, register_zoo_model

# 16 audio embedding tables of 2049 rows dominate the size: widths of 32 (temporal) and 16
# (depth) keep the folder under 10 MB.

# Moshi's SentencePiece puts <unk> <s> </s> first and its text padding token at id 3
# (the token the model writes while it has nothing to say).
MOSHI_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
MOSHI_TEXT_VOCAB = 512
MOSHI_NUM_CODEBOOKS, MOSHI_CODEBOOK_SIZE = 8, 2048
MOSHI_SAMPLE_RATE = 24000


def build_moshi(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, MoshiConfig, MoshiForConditionalGeneration

    tok = build_bpe_tokenizer(MOSHI_SPECIAL_TOKENS, vocab_size=448, chat_template=None, bos_token="<s>",
                              eos_token="</s>", pad_token="<pad>", model_max_length=3000)
    if len(tok) > MOSHI_TEXT_VOCAB:
        raise ValueError(f"tokenizer has {len(tok)} tokens, more than the model's {MOSHI_TEXT_VOCAB}")
    nq, cb = MOSHI_NUM_CODEBOOKS, MOSHI_CODEBOOK_SIZE
    config = MoshiConfig(
        vocab_size=MOSHI_TEXT_VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, ffn_dim=128, max_position_embeddings=3000, sliding_window=3000,
        num_codebooks=nq, audio_vocab_size=cb, pad_token_id=3,
        depth_decoder_config=dict(vocab_size=MOSHI_TEXT_VOCAB, hidden_size=16, input_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, ffn_dim=64,
                                  num_codebooks=nq, audio_vocab_size=cb, max_position_embeddings=nq + 1,
                                  sliding_window=nq),
        audio_encoder_config=dict(model_type="mimi", sampling_rate=MOSHI_SAMPLE_RATE, hidden_size=32, num_filters=4,
                                  num_residual_layers=1, upsampling_ratios=[8, 6, 5, 4], codebook_size=cb,
                                  codebook_dim=16, num_quantizers=nq, num_semantic_quantizers=1,
                                  vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=1,
                                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                                  sliding_window=250, frame_rate=12.5),
    )
    torch.manual_seed(seed)
    model = MoshiForConditionalGeneration(config).float().eval()
    with torch.no_grad():
        # Mimi's codebooks are running averages that start at zero: left so, the codes would
        # not depend on the audio. Random weights of std 0.02 make near-constant logits; a
        # wider spread makes the greedy tokens and codes depend on the inputs.
        for name, buffer in model.audio_encoder.quantizer.named_buffers():
            if name.endswith("codebook.embed_sum"):
                buffer.copy_(torch.randn(buffer.shape))
        for module in (model.embed_tokens, model.decoder, model.depth_decoder):
            for p in module.parameters():
                if p.ndim >= 2:
                    p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)
    # The checkpoint's own sampling (kyutai/moshiko's): a bare request samples like the model card.
    GenerationConfig(do_sample=True, temperature=0.8, top_k=250, pad_token_id=3).save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


register_zoo_model(ZooModel(
    name="moshi",
    kind="speech",
    reference_class="transformers.MoshiForConditionalGeneration",
    builder=build_moshi,
    sizes=("tiny",),
    description="Moshi temporal transformer + depth decoder + Mimi codec (8 x 2048 codes, 24 kHz, "
                "12.5 frames/s), text vocab 512, fp32.",
    revision=1,  # 1: narrower (under 10 MB)
))
