"""Zoo builder for VoxCPM2 (OpenBMB): the folder the authors' `VoxCPM2Model.from_local` loads.

    config.json            `VoxCPMConfig` ("architecture": "voxcpm2", lm/encoder/DiT/VAE sizes)
    model.safetensors      the generation model (omnistage's `VoxCPM2` writes the authors' names)
    audiovae.safetensors   the audio VAE, its convolutions weight-normed (`weight_g`, `weight_v`)
    tokenizer files        a tiny SentencePiece-style BPE (Metaspace) that `LlamaTokenizerFast` loads;
                           ids 101-104 are the audio start/end and reference start/end tokens the
                           model hard-codes; it has multi-character Chinese tokens, which the model's
                           tokenizer wrapper splits into characters

Tiny: 64-wide base LM (2 layers, LongRoPE with its long factors in use), 1 residual layer,
patches of 2 latent steps of 8 channels, a VAE of 8 samples per step in (16 kHz) and 24 out
(48 kHz), fp32.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.testing.zoo import ZooModel, register_zoo_model

AUDIO_TOKENS = {101: "<|audio_start|>", 102: "<|audio_end|>", 103: "<|ref_audio_start|>", 104: "<|ref_audio_end|>"}
# Specials at ids 0..104, as the real vocabulary's reserved range (the model hard-codes 101-104).
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"] + [AUDIO_TOKENS.get(i, f"<|reserved_{i}|>") for i in range(3, 105)]

HEAD_DIM = 16


def tiny_config(vocab_size: int) -> dict:
    half = HEAD_DIM // 2
    lm = dict(bos_token_id=1, eos_token_id=2, hidden_size=64, intermediate_size=128, max_position_embeddings=4096,
              num_attention_heads=4, num_hidden_layers=2, num_key_value_heads=2, rms_norm_eps=1e-5,
              rope_scaling=dict(type="longrope", long_factor=[1.0 + 0.25 * i for i in range(half)],
                                short_factor=[1.0 + 0.1 * i for i in range(half)],
                                original_max_position_embeddings=2048),
              vocab_size=vocab_size, use_mup=True, scale_emb=12, dim_model_base=256, scale_depth=1.4,
              rope_theta=10000.0)
    return {
        "architecture": "voxcpm2",
        "lm_config": lm,
        "patch_size": 2, "feat_dim": 8,
        "residual_lm_num_layers": 1, "residual_lm_no_rope": False,
        "scalar_quantization_latent_dim": 16, "scalar_quantization_scale": 9,
        "encoder_config": dict(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=1),
        "dit_config": dict(hidden_dim=32, ffn_dim=64, num_heads=2, num_layers=2,
                           dit_mean_mode=False, cfm_config=dict(sigma_min=1e-6, solver="euler",
                                                                t_scheduler="log-norm", inference_cfg_rate=1.0)),
        "audio_vae_config": dict(encoder_dim=4, encoder_rates=[2, 4], latent_dim=8, decoder_dim=32,
                                 decoder_rates=[2, 3, 4], depthwise=True, sample_rate=16000, out_sample_rate=48000,
                                 use_noise_block=False, sr_bin_boundaries=[20000, 30000, 40000],
                                 cond_type="scale_bias", cond_dim=16, cond_out_layer=False),
        "max_length": 512,
        "device": "cpu",
        "dtype": "float32",
    }


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from omnistage.testing.tokenizers import CORPUS

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(CORPUS + ["\u4f60\u597d\u4e16\u754c\uff0c\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002"] * 4,
                            trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def _weight_normed(module, state: dict, g) -> dict:
    """Convolution weights as torch's weight_norm stores them: `weight_v` and a gain `weight_g`."""
    import torch

    convs = {name for name, m in module.named_modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))}
    out = {}
    for name, tensor in state.items():
        owner, _, leaf = name.rpartition(".")
        if owner in convs and leaf == "weight":
            norm = tensor.flatten(1).norm(dim=1).view(-1, *([1] * (tensor.ndim - 1)))
            out[f"{owner}.weight_v"] = tensor
            out[f"{owner}.weight_g"] = norm * (0.5 + torch.rand(norm.shape, generator=g))
        else:
            out[name] = tensor
    return out


def build_voxcpm2(out_dir: Path, size: str, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    from omnistage.models.voxcpm2.audio_vae import AudioVAEConfig, Decoder, Encoder
    from omnistage.models.voxcpm2.modeling import VoxCPM2

    tok = build_tokenizer()
    config = tiny_config(len(tok))
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    model = VoxCPM2(config)
    with torch.no_grad():  # zero-initialised parameters would hide mistakes: draw them
        model.feat_encoder.special_token.normal_(generator=g)
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
        # The stop head's two rows nearly equal, so some utterances stop after a few patches
        # and others run to the length cap (independent rows stop every one at the first chance).
        stop = model.stop_head.weight
        stop[1] = stop[0] + 0.3 * torch.randn(stop.shape[1], generator=torch.Generator().manual_seed(seed)) - 0.05
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out_dir / "model.safetensors",
              metadata={"format": "pt"})
    vae_config = AudioVAEConfig.from_dict(config["audio_vae_config"])
    vae = {}
    for part, module in (("encoder", Encoder(vae_config)), ("decoder", Decoder(vae_config))):
        with torch.no_grad():
            for name, p in module.named_parameters():
                if name.endswith("alpha") or "scale_embed" in name:
                    p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
                elif "bias_embed" in name:
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
        state = {k: v for k, v in module.state_dict().items()}
        vae |= {f"{part}.{k}": v.contiguous() for k, v in _weight_normed(module, state, g).items()}
    save_file(vae, out_dir / "audiovae.safetensors", metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok.save_pretrained(out_dir)


register_zoo_model(ZooModel(
    name="voxcpm2",
    kind="speech",
    reference_class="voxcpm.model.voxcpm2.VoxCPM2Model",
    builder=build_voxcpm2,
    sizes=("tiny",),
    description="VoxCPM2 (MiniCPM-4 base + residual LMs, local encoder and DiT over 2 x 8 latent patches) + its "
                "causal audio VAE (16 kHz in, 48 kHz out), fp32.",
))
