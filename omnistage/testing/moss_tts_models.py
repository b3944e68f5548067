"""Zoo builder for MOSS-TTS (OpenMOSS): the folder the authors' `moss_tts_lite` loads, with its
audio tokenizer inside.

    config.json            the model's config ("model_type": "moss_tts_delay", the Qwen3 sizes in
                           "language_config"); the authors' package reads the sizes from the weights
    model.safetensors      bf16, the authors' names: `language_model.*` (Qwen3 layers with q/k
                           norms), `emb_ext.{0..31}` (codebook input tables, 1025 rows with the
                           padding code), `lm_heads.0` (text) and `lm_heads.{1..32}` (codebooks)
    vocab.json, merges.txt, tokenizer.json
                           a tiny byte-level BPE with Qwen's pre-tokenizer; the special tokens sit at
                           Qwen's ids (151643 `<|endoftext|>` ... 151662 the delay slot), which the
                           model hard-codes, so the text tables keep Qwen3-TTS's 155648 rows
    MOSS-Audio-Tokenizer/  the codec: config.json (24 kHz, 1920 samples a frame, the decoder's
                           stages in "decoder_kwargs") and model.safetensors (32 residual codebooks
                           of 1024 codes with weight-normed projections, four causal transformers)

Tiny: a 32-wide backbone (2 layers, 2 heads of 16, 1 KV head). The text head favours
`<|audio_start|>` first, then mostly gen slots (a delay slot about one step in eight), and
`<|im_end|>` after the audio: utterances of a few to a dozen frames.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.zoo import ZooModel, register_zoo_model

TEXT_VOCAB, HIDDEN, N_VQ, CODES = 155648, 32, 32, 1024
SPECIAL = {151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>",
           151652: "<|audio_start|>", 151653: "<|audio_end|>", 151654: "<|audio_user_slot|>",
           151656: "<|audio_assistant_gen_slot|>", 151662: "<|audio_assistant_delay_slot|>"}
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CODEC_STAGES = [(16, 32, 16, 1, 2), (16, 16, 16, 1, 2), (8, 16, 16, 1, 2), (8, 240, 16, 1, 2)]
"""The codec's transformers: (input, output, width, layers, heads), each followed by a patch step."""
CODEC_PATCHES = [2, 2, 2, 240]
CODE_DIM, QUANT_DIM = 8, 16


def build_tokenizer(out_dir: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from omnistage.testing.tokenizers import CORPUS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS + ["Language English Instruction Text Tokens Quality Sound Event Ambient"] * 4,
                            trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    data = json.loads(tok.to_str())
    names = {i: SPECIAL.get(i, f"<|reserved_{i}|>") for i in range(151643, 151663)}
    # In the vocabulary too (as the real one): `tokenizers` renumbers added tokens it cannot find there.
    data["model"]["vocab"] |= {content: i for i, content in names.items()}
    (out_dir / "vocab.json").write_text(json.dumps(data["model"]["vocab"], ensure_ascii=False))
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    data["added_tokens"] = [{"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, content in names.items()]
    (out_dir / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))


def _backbone(seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape, std=1.0: std * torch.randn(*shape, generator=g)  # noqa: E731
    head_dim, heads, kv_heads, inter = 16, 2, 1, 64
    w = {}
    embed = rand(TEXT_VOCAB, HIDDEN, std=0.5)
    embed[:, 0] = 4.0  # a steady positive feature the text head's special rows read
    w["language_model.embed_tokens.weight"] = embed
    for i in range(2):
        p = f"language_model.layers.{i}."
        w |= {p + "self_attn.q_proj.weight": rand(heads * head_dim, HIDDEN, std=0.1),
              p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, HIDDEN, std=0.1),
              p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, HIDDEN, std=0.1),
              p + "self_attn.o_proj.weight": rand(HIDDEN, heads * head_dim, std=0.05),
              p + "self_attn.q_norm.weight": 1 + rand(head_dim, std=0.1),
              p + "self_attn.k_norm.weight": 1 + rand(head_dim, std=0.1),
              p + "input_layernorm.weight": 1 + rand(HIDDEN, std=0.1),
              p + "post_attention_layernorm.weight": 1 + rand(HIDDEN, std=0.1),
              p + "mlp.gate_proj.weight": rand(inter, HIDDEN, std=0.1),
              p + "mlp.up_proj.weight": rand(inter, HIDDEN, std=0.1),
              p + "mlp.down_proj.weight": rand(HIDDEN, inter, std=0.05)}
    w["language_model.norm.weight"] = 1 + rand(HIDDEN, std=0.1)
    for i in range(N_VQ):
        ext = rand(CODES + 1, HIDDEN, std=0.1)
        ext[:, 0] = 0.0
        w[f"emb_ext.{i}.weight"] = ext
    head = rand(TEXT_VOCAB, HIDDEN, std=0.02)
    for token, bias in ((151652, 3.5), (151645, 4.5), (151656, 1.0), (151662, -0.1)):  # start, end, gen, delay
        head[token] = rand(HIDDEN, std=0.3)
        head[token, 0] = bias
    w["lm_heads.0.weight"] = head
    for i in range(N_VQ):
        w[f"lm_heads.{i + 1}.weight"] = rand(CODES + 1, HIDDEN, std=0.5)
    return {k: v.to(torch.bfloat16).contiguous() for k, v in w.items()}


def _codec(seed: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    rand = lambda *shape, std=1.0: std * torch.randn(*shape, generator=g)  # noqa: E731
    wn = "parametrizations.weight.original"
    w = {}
    for i in range(N_VQ):
        p = f"quantizer.quantizers.{i}."
        w |= {p + "codebook.weight": rand(CODES, CODE_DIM), p + f"out_proj.{wn}0": 0.2 + rand(QUANT_DIM, 1, 1).abs(),
              p + f"out_proj.{wn}1": rand(QUANT_DIM, CODE_DIM, 1), p + "out_proj.bias": rand(QUANT_DIM, std=0.1)}
    w |= {f"quantizer.output_proj.{wn}0": 0.5 + rand(QUANT_DIM, 1, 1).abs(),
          f"quantizer.output_proj.{wn}1": rand(QUANT_DIM, QUANT_DIM, 1),
          "quantizer.output_proj.bias": rand(QUANT_DIM, std=0.1)}
    for s, (d_in, d_out, d, layers, _) in enumerate(CODEC_STAGES):
        p = f"decoder.{2 * s}."
        if d != d_in:
            w[p + "input_proj.weight"] = rand(d, d_in, std=d_in ** -0.5)
        if d != d_out:  # the last stage's output is the waveform: kept within +-1
            w[p + "output_proj.weight"] = rand(d_out, d, std=(0.01 if d_out == 240 else 1) * d ** -0.5)
        for i in range(layers):
            lp = f"{p}transformer.layers.{i}."
            w |= {lp + "self_attn.in_projs.0.weight": rand(3 * d, d, std=d ** -0.5),
                  lp + "self_attn.out_projs.0.weight": rand(d, d, std=d ** -0.5),
                  lp + "norm1.weight": 1 + rand(d, std=0.1), lp + "norm1.bias": rand(d, std=0.1),
                  lp + "norm2.weight": 1 + rand(d, std=0.1), lp + "norm2.bias": rand(d, std=0.1),
                  lp + "linear1.weight": rand(4 * d, d, std=d ** -0.5),
                  lp + "linear2.weight": rand(d, 4 * d, std=(4 * d) ** -0.5),
                  lp + "layer_scale_1.scale": 0.5 + rand(d, std=0.1), lp + "layer_scale_2.scale": 0.5 + rand(d, std=0.1)}
    return {k: v.contiguous() for k, v in w.items()}


def codec_config() -> dict:
    stages = []
    for (d_in, d_out, d, layers, heads), patch in zip(CODEC_STAGES, CODEC_PATCHES):
        stages += [{"module_type": "Transformer", "input_dimension": d_in, "output_dimension": d_out, "d_model": d,
                    "num_heads": heads, "num_layers": layers, "causal": True},
                   {"module_type": "PatchedPretransform", "patch_size": patch}]
    return {"model_type": "moss-audio-tokenizer", "sampling_rate": 24000, "downsample_rate": 1920,
            "causal_transformer_context_duration": 0.64,
            "quantizer_kwargs": {"quantizer_type": "rlfq", "num_quantizers": N_VQ, "codebook_size": CODES,
                                 "codebook_dim": CODE_DIM, "rvq_dim": QUANT_DIM},
            "decoder_kwargs": stages}


def build_moss_tts(out_dir: Path, size: str, seed: int) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir)
    save_file(_backbone(seed), out_dir / "model.safetensors", metadata={"format": "pt"})
    config = {"model_type": "moss_tts_delay", "architectures": ["MossTTSDelayModel"], "n_vq": N_VQ,
              "audio_vocab_size": CODES, "audio_pad_code": CODES, "sampling_rate": 24000,
              "language_config": {"model_type": "qwen3", "hidden_size": HIDDEN, "num_hidden_layers": 2,
                                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                                  "intermediate_size": 64, "vocab_size": TEXT_VOCAB, "rope_theta": 1000000.0,
                                  "rms_norm_eps": 1e-6, "max_position_embeddings": 4096}}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    codec = out_dir / "MOSS-Audio-Tokenizer"
    codec.mkdir(exist_ok=True)
    save_file(_codec(seed), codec / "model.safetensors", metadata={"format": "pt"})
    (codec / "config.json").write_text(json.dumps(codec_config(), indent=2) + "\n")


register_zoo_model(ZooModel(
    name="moss-tts",
    kind="speech",
    reference_class="moss_tts_lite.model.MossTTSModel",
    builder=build_moss_tts,
    sizes=("tiny",),
    description="MOSS-TTS (Qwen3 backbone over text + 32 delayed codebooks) + MOSS-Audio-Tokenizer's causal "
                "transformer decoder (24 kHz), bf16 backbone, fp32 codec.",
))
