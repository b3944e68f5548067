"""Zoo builder for OmniVoice (k2-fsa): the folder the authors' `OmniVoice.from_pretrained` loads.

    config.json          "model_type": "omnivoice", the audio vocabulary (codes + the mask code),
                         the codebook loss weights and the backbone's Qwen3 config in "llm_config"
    model.safetensors    the authors' names: `llm.*` (a Qwen3 model), `audio_embeddings`,
                         `audio_heads`, `codebook_layer_offsets`
    tokenizer.json ...   a tiny byte-level BPE with the authors' added specials
                         (<|denoise|>, <|lang_start|> ... <|text_end|>)
    audio_tokenizer/     Higgs-Audio v2's audio tokenizer (the zoo's tiny one: 4 codebooks of 32
                         codes, 25 frames/s at 24 kHz) with its feature extractor's config

Tiny: a 32-wide backbone, 2 layers; 4 codebooks of 32 codes (real: 8 x 1024, mask id 1024).
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.zoo import ZooModel, register_zoo_model

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|denoise|>", "<|lang_start|>", "<|lang_end|>",
                  "<|instruct_start|>", "<|instruct_end|>", "<|text_start|>", "<|text_end|>"]


def omnivoice_config(num_codebooks: int, codebook_size: int, vocab_size: int) -> dict:
    llm = dict(model_type="qwen3", vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
               rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False)
    return {"architectures": ["OmniVoice"], "model_type": "omnivoice", "audio_vocab_size": codebook_size + 1,
            "audio_mask_id": codebook_size, "num_audio_codebook": num_codebooks,
            "audio_codebook_weights": [8, 6, 4, 2][:num_codebooks], "llm_config": llm}


def build_omnivoice(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import DacFeatureExtractor

    from omnistage.models.omnivoice.modeling import OmniVoiceModel
    from omnistage.testing.decoder_init import init_varied_decoder
    from omnistage.testing.higgs_audio_models import (HIGGS_CODEC_SIZE, HIGGS_NUM_CODEBOOKS, HIGGS_SAMPLE_RATE,
                                                       build_audio_tokenizer)
    from omnistage.testing.tokenizers import build_bpe_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_bpe_tokenizer(SPECIAL_TOKENS, vocab_size=448, chat_template=None, model_max_length=1024)
    config = omnivoice_config(HIGGS_NUM_CODEBOOKS, HIGGS_CODEC_SIZE, vocab_size=512)
    torch.manual_seed(seed)
    model = OmniVoiceModel(config).float().eval()
    # Varied weights: greedy codes then differ from position to position.
    init_varied_decoder(model, seed, final_norm="llm.norm")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out_dir / "model.safetensors",
              metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok.save_pretrained(out_dir)
    build_audio_tokenizer(out_dir / "audio_tokenizer", seed)
    DacFeatureExtractor(feature_size=1, hop_length=960, padding_side="right", padding_value=0.0,
                        sampling_rate=HIGGS_SAMPLE_RATE).save_pretrained(out_dir / "audio_tokenizer")


register_zoo_model(ZooModel(
    name="omnivoice",
    kind="speech",
    reference_class="omnivoice.OmniVoice",
    builder=build_omnivoice,
    sizes=("tiny",),
    call_kwargs={"text": "Hello there."},  # the reference `generate`'s; its unmasking stage is a native pipeline
    description="OmniVoice: a bidirectional Qwen3 unmasking 4 x 32 codes (+ the mask code) with CFG, and "
                "Higgs-Audio v2's audio tokenizer in audio_tokenizer/, fp32.",
))
