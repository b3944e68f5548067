"""Zoo builder for Fish Speech's dual-AR transformer (fishaudio; the OpenAudio S1 line): the
folder the authors' `fish-speech` loads (`DualARTransformer.from_pretrained`).

    config.json            "model_type": "dual_ar" and the sizes (`DualARModelArgs` fields)
    model.pth              a torch state dict, the authors' names: `embeddings`, `codebook_embeddings`,
                           `layers.{i}.attention.wqkv` (+ q/k norms), `feed_forward.w1/w2/w3`, `norm`, `output`,
                           `fast_project_in`, `fast_embeddings`, `fast_layers.{i}.*`, `fast_norm`,
                           `fast_output`
    tokenizer.tiktoken     base64 byte ranks: the 256 bytes and a few merges
    special_tokens.json    the authors' special tokens (`<|im_end|>`, `<|interleave|>`, ... and 1024
                           `<|semantic:N|>`) numbered after the ranks
    codec.pth              the authors' modded DAC state dict (decoding tensors only), their names:
                           `quantizer.{semantic_quantizer,quantizer}.quantizers.{i}` (codebook,
                           weight-normed out_proj), `quantizer.post_module.*` (the window-limited
                           transformer), `quantizer.upsample.*`, `decoder.model.*`

Tiny: a 32-wide slow transformer (2 layers, 2 heads of 16, 1 KV head, q/k norms), a 24-wide fast
one (1 layer) over 4 codebooks of 1024 codes; the codec at `CODEC`'s sizes.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import torch

from omnistage.testing.zoo import ZooModel, register_zoo_model

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<|phoneme_start|>",
           "<|phoneme_end|>", "<|tool_call_start|>", "<|tool_call_end|>", "<|text|>", "<|voice|>",
           "<|interleave|>", "<|audio_start|>", "<|audio_end|>", "<|audio|>"]
MERGES = [b"th", b"he", b"the", b" t", b" the", b"in", b"er", b"an", b"re", b"on", b" a", b"ou", b"is", b"ll"]
CONFIG = {"model_type": "dual_ar", "dim": 32, "n_layer": 2, "n_head": 2, "n_local_heads": 1, "head_dim": 16,
          "intermediate_size": 64, "codebook_size": 1024, "num_codebooks": 4, "n_fast_layer": 1, "fast_dim": 24,
          "fast_n_head": 2, "fast_n_local_heads": 1, "fast_head_dim": 12, "fast_intermediate_size": 48,
          "attention_qk_norm": True, "attention_qkv_bias": False, "attention_o_bias": False,
          "tie_word_embeddings": False, "scale_codebook_embeddings": True, "rope_base": 1000000.0,
          "norm_eps": 1e-6, "max_seq_len": 256, "dropout": 0.0, "use_gradient_checkpointing": False}


def _block(prefix: str, dim: int, heads: int, kv_heads: int, head_dim: int, hidden: int, g) -> dict:
    w = lambda *shape: torch.randn(*shape, generator=g) * 0.1  # noqa: E731
    norm = lambda n: 1 + 0.1 * torch.randn(n, generator=g)  # noqa: E731
    return {f"{prefix}attention.wqkv.weight": w((heads + 2 * kv_heads) * head_dim, dim),
            f"{prefix}attention.wo.weight": w(dim, heads * head_dim),
            f"{prefix}attention.q_norm.weight": norm(head_dim), f"{prefix}attention.k_norm.weight": norm(head_dim),
            f"{prefix}feed_forward.w1.weight": w(hidden, dim), f"{prefix}feed_forward.w3.weight": w(hidden, dim),
            f"{prefix}feed_forward.w2.weight": w(dim, hidden),
            f"{prefix}attention_norm.weight": norm(dim), f"{prefix}ffn_norm.weight": norm(dim)}


def build_fish_speech(out_dir: Path, size: str = "tiny", seed: int = 0) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks = [bytes([b]) for b in range(256)] + MERGES
    (out_dir / "tokenizer.tiktoken").write_text(
        "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    special = SPECIAL + [f"<|semantic:{i}|>" for i in range(CONFIG["codebook_size"])]
    (out_dir / "special_tokens.json").write_text(json.dumps({t: len(ranks) + i for i, t in enumerate(special)}))
    c = dict(CONFIG, vocab_size=len(ranks) + len(special))
    (out_dir / "config.json").write_text(json.dumps(c, indent=2))
    g = torch.Generator().manual_seed(seed)
    weights = {"embeddings.weight": torch.randn(c["vocab_size"], c["dim"], generator=g) * 0.3,
               "codebook_embeddings.weight": torch.randn(c["codebook_size"] * c["num_codebooks"], c["dim"],
                                                         generator=g) * 0.3,
               "norm.weight": 1 + 0.1 * torch.randn(c["dim"], generator=g),
               "output.weight": torch.randn(c["vocab_size"], c["dim"], generator=g) * 0.3,
               "fast_project_in.weight": torch.randn(c["fast_dim"], c["dim"], generator=g) * 0.2,
               "fast_project_in.bias": torch.randn(c["fast_dim"], generator=g) * 0.1,
               "fast_embeddings.weight": torch.randn(c["codebook_size"], c["fast_dim"], generator=g) * 0.3,
               "fast_norm.weight": 1 + 0.1 * torch.randn(c["fast_dim"], generator=g),
               "fast_output.weight": torch.randn(c["codebook_size"], c["fast_dim"], generator=g) * 0.3}
    for i in range(c["n_layer"]):
        weights |= _block(f"layers.{i}.", c["dim"], c["n_head"], c["n_local_heads"], c["head_dim"],
                          c["intermediate_size"], g)
    for i in range(c["n_fast_layer"]):
        weights |= _block(f"fast_layers.{i}.", c["fast_dim"], c["fast_n_head"], c["fast_n_local_heads"],
                          c["fast_head_dim"], c["fast_intermediate_size"], g)
    torch.save(weights, out_dir / "model.pth")
    build_fish_speech_codec(out_dir, c["num_codebooks"], c["codebook_size"], seed=seed + 1)


# The codec (the authors' modded DAC, `modded_dac_vq.yaml` at tiny sizes): a 128-wide latent
# (2 heads of the config's 64), 2 window-limited transformer layers, a 32-wide DAC decoder.
CODEC = {"latent_dim": 128, "n_layer": 2, "intermediate_size": 192, "codebook_dim": 8, "decoder_dim": 32,
         "decoder_rates": (8, 8, 4, 2), "downsample_factor": (2, 2)}


def _weight_normed(prefix: str, shape: tuple, g, old_style: bool = False) -> dict:
    """A weight-normed conv's tensors: torch's parametrization names (the authors' convs) or
    the older `weight_g` / `weight_v` (DAC's `WNConv1d`)."""
    v = torch.randn(*shape, generator=g) * 0.3
    norm = (0.3 + 0.2 * torch.rand(shape[0], generator=g)).view(-1, *[1] * (len(shape) - 1))
    names = ("weight_g", "weight_v") if old_style else ("parametrizations.weight.original0",
                                                        "parametrizations.weight.original1")
    return {f"{prefix}.{names[0]}": norm, f"{prefix}.{names[1]}": v}


def build_fish_speech_codec(out_dir: Path, num_codebooks: int, codebook_size: int, seed: int = 1) -> None:
    """codec.pth: the decoding tensors of the authors' DAC state dict, their names (the encoder,
    which only cloning reads, is left out; the authors load with strict=False)."""
    c, g = CODEC, torch.Generator().manual_seed(seed)
    w = lambda *shape, scale=0.1: torch.randn(*shape, generator=g) * scale  # noqa: E731
    d = c["latent_dim"]
    weights = {}
    for name, count in (("semantic_quantizer", 1), ("quantizer", num_codebooks - 1)):
        for i in range(count):
            p = f"quantizer.{name}.quantizers.{i}"
            weights[f"{p}.codebook.weight"] = w(codebook_size, c["codebook_dim"], scale=1.0)
            weights |= _weight_normed(f"{p}.out_proj", (d, c["codebook_dim"], 1), g, old_style=True)
            weights[f"{p}.out_proj.bias"] = w(d)
    p = "quantizer.post_module."
    for i in range(c["n_layer"]):
        weights |= {f"{p}layers.{i}.attention.wqkv.weight": w(3 * d, d), f"{p}layers.{i}.attention.wo.weight": w(d, d),
                    f"{p}layers.{i}.feed_forward.w1.weight": w(c["intermediate_size"], d),
                    f"{p}layers.{i}.feed_forward.w3.weight": w(c["intermediate_size"], d),
                    f"{p}layers.{i}.feed_forward.w2.weight": w(d, c["intermediate_size"]),
                    f"{p}layers.{i}.attention_norm.weight": 1 + w(d), f"{p}layers.{i}.ffn_norm.weight": 1 + w(d),
                    f"{p}layers.{i}.attention_layer_scale.gamma": 0.5 + w(d),
                    f"{p}layers.{i}.ffn_layer_scale.gamma": 0.5 + w(d)}
    weights[f"{p}norm.weight"] = 1 + w(d)
    for i, factor in enumerate(reversed(c["downsample_factor"])):
        p = f"quantizer.upsample.{i}"
        weights |= {f"{p}.0.conv.weight": w(d, d, factor), f"{p}.0.conv.bias": w(d),
                    f"{p}.1.dwconv.conv.weight": w(d, 1, 7, scale=0.3), f"{p}.1.dwconv.conv.bias": w(d),
                    f"{p}.1.norm.weight": 1 + w(d), f"{p}.1.norm.bias": w(d),
                    f"{p}.1.pwconv1.weight": w(4 * d, d), f"{p}.1.pwconv1.bias": w(4 * d),
                    f"{p}.1.pwconv2.weight": w(d, 4 * d), f"{p}.1.pwconv2.bias": w(d), f"{p}.1.gamma": 0.5 + w(d)}
    channels = c["decoder_dim"]
    weights |= _weight_normed("decoder.model.0.conv", (channels, d, 7), g)
    weights["decoder.model.0.conv.bias"] = w(channels)
    for i, stride in enumerate(c["decoder_rates"]):
        p, out = f"decoder.model.{i + 1}.block", channels // 2
        weights[f"{p}.0.alpha"] = 1 + 0.3 * torch.rand(1, channels, 1, generator=g)
        weights |= _weight_normed(f"{p}.1.conv", (channels, out, 2 * stride), g)
        weights[f"{p}.1.conv.bias"] = w(out)
        for j in range(3):
            q = f"{p}.{2 + j}.block"
            weights |= {f"{q}.0.alpha": 1 + 0.3 * torch.rand(1, out, 1, generator=g),
                        f"{q}.2.alpha": 1 + 0.3 * torch.rand(1, out, 1, generator=g),
                        f"{q}.1.conv.bias": w(out), f"{q}.3.conv.bias": w(out)}
            weights |= _weight_normed(f"{q}.1.conv", (out, out, 7), g) | _weight_normed(f"{q}.3.conv", (out, out, 1), g)
        channels = out
    n = len(c["decoder_rates"]) + 1
    weights[f"decoder.model.{n}.alpha"] = 1 + 0.3 * torch.rand(1, channels, 1, generator=g)
    weights |= _weight_normed(f"decoder.model.{n + 1}.conv", (1, channels, 7), g)
    weights[f"decoder.model.{n + 1}.conv.bias"] = w(1)
    torch.save(weights, Path(out_dir) / "codec.pth")


register_zoo_model(ZooModel(
    name="fish-speech",
    kind="speech",
    reference_class="fish_speech.models.text2semantic.llama.DualARTransformer",
    builder=build_fish_speech,
    sizes=("tiny",),
    description="Fish Speech / OpenAudio S1 (dual-AR: slow semantic + fast codebook transformer) + the authors' "
                "modded DAC decoder (44.1 kHz), fp32.",
))
