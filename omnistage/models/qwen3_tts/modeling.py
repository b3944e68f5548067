"""Qwen3-TTS's networks, built from transformers classes, and loaded from the released files.

transformers has no Qwen3-TTS class, but every part of it is one transformers has:

- the talker is a dense Qwen3 decoder (`Qwen3Model`: q/k-normed attention, SwiGLU) whose
  input embedding is the codec table, plus a text embedding, `text_projection` (a 2-layer
  MLP) and `codec_head`. Its M-RoPE positions are one text position repeated on all three
  axes (text-only prompts), so one plain RoPE position is the same rotation;
- the code predictor is a small `Qwen3Model` fed embeddings only (one table per codebook
  after the first, and a linear `small_to_mtp_projection` when its width differs from the
  talker's), with one head per codebook;
- the 12 Hz speech tokenizer's decoder is Qwen3-Omni's code2wav (transformers'
  `Qwen3OmniMoeCode2Wav*` blocks: a sliding-window causal transformer, causal
  upsampling, the BigVGAN-style decoder) behind a split residual VQ and a causal conv,
  with projections into and out of its transformer.

The checkpoint (`config.json` + `model.safetensors`, the speech tokenizer in
`speech_tokenizer/`) names weights as the authors' modules do; `TALKER_RENAMES` maps them
onto these modules (and back, for the zoo builder). The tokenizer's encoder (Mimi) is for
voice cloning (cloning.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

# checkpoint prefix -> this module's prefix (first match wins; both directions).
TALKER_RENAMES = (
    ("talker.model.codec_embedding.", "model.decoder.embed_tokens."),
    ("talker.model.text_embedding.", "model.text_embedding."),
    ("talker.model.", "model.decoder."),
    ("talker.code_predictor.small_to_mtp_projection.", "code_predictor.model.projection."),
    ("talker.code_predictor.model.codec_embedding.", "code_predictor.model.codec_embedding."),
    ("talker.code_predictor.model.", "code_predictor.model.decoder."),
    ("talker.", ""),
)
CODEC_PREFIX = "decoder."  # the speech tokenizer's decoder weights; "encoder." is Mimi's
# The speech tokenizer's encoder is stored under transformers 4's Mimi names (without the decoder
# half): transformers 5 name -> released name, below "encoder.".
MIMI_4_NAMES = (("encoder.encoder_seanet.", "encoder."), ("encoder.encoder_transformer.", "encoder_transformer."),
                ("encoder.downsample.", "downsample."), ("quantizer.", "quantizer."))


def read_config(path: str | Path, name: str = "config.json") -> dict[str, Any]:
    return json.loads((Path(path) / name).read_text())


def _qwen3_config(cfg: dict[str, Any], vocab_size: int, head_dim: int):
    from transformers import Qwen3Config

    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=cfg["num_attention_heads"],
        num_key_value_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"], head_dim=head_dim,
        hidden_act=cfg.get("hidden_act", "silu"), max_position_embeddings=cfg.get("max_position_embeddings", 32768),
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6), attention_bias=cfg.get("attention_bias", False),
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000))},
        use_sliding_window=False, tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    return config


def talker_text_config(talker: dict[str, Any]):
    """The talker decoder's `Qwen3Config` (what sizes its KV cache)."""
    rope = talker.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"Qwen3-TTS talker: rope type {rope.get('rope_type')!r} is not supported (only 'default')")
    head_dim = talker.get("head_dim") or talker["hidden_size"] // talker["num_attention_heads"]
    return _qwen3_config(talker, talker["vocab_size"], head_dim)


class ResizeMLP(nn.Module):
    """The talker's `text_projection`: text width -> talker width."""

    def __init__(self, in_size: int, mid_size: int, out_size: int, act: str) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.linear_fc1 = nn.Linear(in_size, mid_size, bias=True)
        self.linear_fc2 = nn.Linear(mid_size, out_size, bias=True)
        self.act_fn = ACT2FN[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(self.act_fn(self.linear_fc1(x)))


class TalkerBackbone(nn.Module):
    """The talker decoder (`decoder.embed_tokens` is the codec table) and its text embedding."""

    def __init__(self, talker: dict[str, Any]) -> None:
        super().__init__()
        from transformers import Qwen3Model

        self.config = talker_text_config(talker)
        self.decoder = Qwen3Model(self.config)
        self.text_embedding = nn.Embedding(talker["text_vocab_size"], talker["text_hidden_size"])

    def forward(self, inputs_embeds, position_ids, attention_mask, cache, use_cache=True):
        # [3, B, T] M-RoPE positions are equal on every axis for text prompts: one row is the rotation.
        positions = position_ids[0] if position_ids.ndim == 3 else position_ids
        return self.decoder(inputs_embeds=inputs_embeds, position_ids=positions, attention_mask=attention_mask,
                            cache=cache, use_cache=use_cache)


class PredictorBackbone(nn.Module):
    """The code predictor's decoder, fed talker-width embeddings through `projection`."""

    def __init__(self, predictor: dict[str, Any], talker_hidden: int) -> None:
        super().__init__()
        from transformers import Qwen3Model

        self.config = _qwen3_config(predictor, 1, predictor.get("head_dim", 128))  # no token table: embeddings only
        self.decoder = Qwen3Model(self.config)
        groups = predictor["num_code_groups"]
        self.codec_embedding = nn.ModuleList(nn.Embedding(predictor["vocab_size"], talker_hidden)
                                             for _ in range(groups - 1))
        self.projection = (nn.Linear(talker_hidden, predictor["hidden_size"], bias=True)
                           if predictor["hidden_size"] != talker_hidden else nn.Identity())

    def forward(self, inputs_embeds, cache, use_cache=True):
        return self.decoder(inputs_embeds=self.projection(inputs_embeds), cache=cache, use_cache=use_cache)


class CodePredictor(nn.Module):
    def __init__(self, predictor: dict[str, Any], talker_hidden: int) -> None:
        super().__init__()
        self.model = PredictorBackbone(predictor, talker_hidden)
        self.config = self.model.config
        self.lm_head = nn.ModuleList(nn.Linear(predictor["hidden_size"], predictor["vocab_size"], bias=False)
                                     for _ in range(predictor["num_code_groups"] - 1))

    def get_input_embeddings(self) -> nn.ModuleList:
        return self.model.codec_embedding


class Qwen3TTSTalkerModel(nn.Module):
    """`talker.*` of a Qwen3-TTS checkpoint."""

    def __init__(self, talker: dict[str, Any]) -> None:
        super().__init__()
        self.model = TalkerBackbone(talker)
        self.text_projection = ResizeMLP(talker["text_hidden_size"], talker["text_hidden_size"],
                                         talker["hidden_size"], talker.get("hidden_act", "silu"))
        self.codec_head = nn.Linear(talker["hidden_size"], talker["vocab_size"], bias=False)
        self.code_predictor = CodePredictor(talker["code_predictor_config"], talker["hidden_size"])

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.decoder.embed_tokens

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))


def rename(key: str, renames=TALKER_RENAMES, reverse: bool = False) -> str | None:
    for ckpt, ours in renames:
        src, dst = (ours, ckpt) if reverse else (ckpt, ours)
        if key.startswith(src):
            return dst + key[len(src):]
    return None


def talker_state_dict(model: Qwen3TTSTalkerModel) -> dict[str, torch.Tensor]:
    """The talker's weights under the checkpoint's names (the zoo builder writes these)."""
    out = {}
    for key, value in model.state_dict().items():
        if key == "code_predictor.model.decoder.embed_tokens.weight":
            continue  # a placeholder: the predictor reads embeddings only
        out[rename(key, reverse=True)] = value
    return out


def _load_into(module: nn.Module, weights: dict[str, torch.Tensor], what: str,
               optional: tuple[str, ...] = ()) -> None:
    missing, unexpected = module.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k not in optional]
    if missing or unexpected:
        raise ValueError(f"{what}: checkpoint does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


def load_talker(model_path: str, device: torch.device, dtype: torch.dtype) -> tuple[Qwen3TTSTalkerModel, dict]:
    from safetensors.torch import load_file

    config = read_config(model_path)
    weights = {}
    for file in sorted(Path(model_path).glob("*.safetensors")):
        for key, value in load_file(str(file)).items():
            if key.startswith("talker."):
                weights[rename(key)] = value
    model = Qwen3TTSTalkerModel(config["talker_config"])
    _load_into(model, weights, f"{model_path} talker", optional=("code_predictor.model.decoder.embed_tokens.weight",))
    return model.to(device, dtype).eval(), config


# --- the 12 Hz speech tokenizer's decoder -----------------------------------------------------


class _Codebook(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T, dim]
        return nn.functional.embedding(codes, self.embedding_sum / self.cluster_usage.clamp(min=1e-5)[:, None])


class _Layer(nn.Module):
    def __init__(self, size: int, dim: int) -> None:
        super().__init__()
        self._codebook = _Codebook(size, dim)


class _Layers(nn.Module):
    def __init__(self, num: int, size: int, dim: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Layer(size, dim) for _ in range(num))


class ResidualVQ(nn.Module):
    """One residual VQ: the codebooks' vectors summed, projected to the output width (1x1 conv)."""

    def __init__(self, num: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.vq = _Layers(num, size, dim)
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)  # stored for the encoder side; decoding skips it
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:  # [B, K, T] -> [B, io_dim, T]
        total = sum(layer._codebook.decode(codes[:, k]) for k, layer in enumerate(self.vq.layers))
        return self.output_proj(total.transpose(1, 2))


class SplitResidualVQ(nn.Module):
    """The first (semantic) codebook and the other (acoustic) ones, quantized apart, summed."""

    def __init__(self, num: int, size: int, dim: int, io_dim: int) -> None:
        super().__init__()
        self.rvq_first = ResidualVQ(1, size, dim, io_dim)
        self.rvq_rest = ResidualVQ(num - 1, size, dim, io_dim)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


def _code2wav_config(cfg: dict[str, Any]):
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig

    keys = ("codebook_size", "hidden_size", "max_position_embeddings", "num_attention_heads", "num_key_value_heads",
            "attention_bias", "sliding_window", "intermediate_size", "hidden_act", "layer_scale_initial_scale",
            "rms_norm_eps", "num_hidden_layers", "num_quantizers", "decoder_dim", "attention_dropout")
    defaults = dict(codebook_size=2048, hidden_size=1024, max_position_embeddings=8000, num_attention_heads=16,
                    num_key_value_heads=16, attention_bias=False, sliding_window=72, intermediate_size=3072,
                    hidden_act="silu", layer_scale_initial_scale=0.01, rms_norm_eps=1e-5, num_hidden_layers=8,
                    num_quantizers=16, decoder_dim=1536, attention_dropout=0.0)
    config = Qwen3OmniMoeCode2WavConfig(
        **{k: cfg.get(k, defaults[k]) for k in keys},
        upsample_rates=list(cfg.get("upsample_rates", (8, 5, 4, 3))),
        upsampling_ratios=list(cfg.get("upsampling_ratios", (2, 2))),
        rope_parameters={"rope_type": "default", "rope_theta": float(cfg.get("rope_theta", 10000))},
    )
    config._attn_implementation = "sdpa"
    return config


def _pre_transformer_class():
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2WavTransformerModel

    class PreTransformer(Qwen3OmniMoeCode2WavTransformerModel):
        """Qwen3-Omni's code2wav transformer between projections from and to the latent width."""

        def __init__(self, config, latent_dim: int) -> None:
            super().__init__(config)
            self.input_proj = nn.Linear(latent_dim, config.hidden_size)
            self.output_proj = nn.Linear(config.hidden_size, latent_dim)

        def forward(self, latent: torch.Tensor, **kwargs) -> torch.Tensor:  # [B, T, latent] -> [B, T, latent]
            # kwargs: a streamed decode's mask, positions and cache (qwen3_omni/code2wav.py)
            hidden = super().forward(inputs_embeds=self.input_proj(latent), **kwargs).last_hidden_state
            return self.output_proj(hidden)

    return PreTransformer


class CodecDecoder(nn.Module):
    """The speech tokenizer's `decoder.*`: codes [B, num_quantizers, T] -> waveform [B, 1, T * upsample]."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            Qwen3OmniMoeCausalConvNet,
            Qwen3OmniMoeCausalTransConvNet,
            Qwen3OmniMoeCode2WavDecoderBlock,
            Qwen3OmniMoeConvNeXtBlock,
            Qwen3OmniMoeSnakeBeta,
        )

        self.config = config = _code2wav_config(cfg)
        latent = cfg.get("latent_dim", 1024)
        codebook_dim = cfg.get("codebook_dim", 512)
        self.total_upsample = int(np.prod(config.upsample_rates + config.upsampling_ratios))
        self.quantizer = SplitResidualVQ(config.num_quantizers, config.codebook_size, codebook_dim // 2, codebook_dim)
        self.pre_conv = Qwen3OmniMoeCausalConvNet(codebook_dim, latent, kernel_size=3)
        self.pre_transformer = _pre_transformer_class()(config, latent)
        self.upsample = nn.ModuleList(
            nn.ModuleList([Qwen3OmniMoeCausalTransConvNet(latent, latent, f, f), Qwen3OmniMoeConvNeXtBlock(latent)])
            for f in config.upsampling_ratios)
        out_dim = config.decoder_dim // 2 ** len(config.upsample_rates)
        self.decoder = nn.ModuleList([
            Qwen3OmniMoeCausalConvNet(latent, config.decoder_dim, 7),
            *(Qwen3OmniMoeCode2WavDecoderBlock(config, i) for i in range(len(config.upsample_rates))),
            Qwen3OmniMoeSnakeBeta(out_dim),
            Qwen3OmniMoeCausalConvNet(out_dim, 1, 7),
        ])
        # The authors' causal transposed convolution cuts its whole overhang (kernel - stride) on
        # the right: T frames make exactly T * upsample samples. Qwen3-Omni's cuts it on both sides.
        for module in self.modules():
            if isinstance(module, Qwen3OmniMoeCausalTransConvNet):
                module.left_pad = 0

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        hidden = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        hidden = self.pre_transformer(hidden).permute(0, 2, 1)
        for blocks in self.upsample:
            for block in blocks:
                hidden = block(hidden)
        for block in self.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)


def codec_state_dict(model: CodecDecoder) -> dict[str, torch.Tensor]:
    return {CODEC_PREFIX + k: v for k, v in model.state_dict().items()}


def load_codec_decoder(model_path: str, device: torch.device) -> tuple[CodecDecoder, dict]:
    from safetensors.torch import load_file

    folder = Path(model_path) / "speech_tokenizer"
    config = read_config(folder)
    if config.get("model_type") != "qwen3_tts_tokenizer_12hz":
        raise ValueError(f"{folder}: speech tokenizer {config.get('model_type')!r} is not supported "
                         "(only the 12 Hz tokenizer, qwen3_tts_tokenizer_12hz)")
    weights = {}
    for file in sorted(folder.glob("*.safetensors")):
        for key, value in load_file(str(file)).items():
            if key.startswith(CODEC_PREFIX):
                weights[key[len(CODEC_PREFIX):]] = value
    model = CodecDecoder(config["decoder_config"])
    _load_into(model, weights, f"{folder} decoder")
    # fp32 whatever the stage dtype, as for Qwen3-Omni's code2wav: small, and the waveform is float.
    return model.to(device, torch.float32).eval(), config
