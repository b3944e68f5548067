"""Tiny LoRAs for zoo checkpoints: a diffusion transformer's in diffusers' LoRA safetensors format
(`build_lora`), a causal LM's as a peft adapter folder (`build_peft_lora`).

`build_lora(model_dir, out_file)` reads the transformer's weights from a zoo (or any
diffusers) folder and writes, for every linear weight whose name ends in one of
`targets`, `transformer.<layer>.lora_A.weight` [rank, in] and `.lora_B.weight` [out, rank]
with seeded random values: the file diffusers' `load_lora_weights` and our `lora` deploy
field read. Unlike a freshly initialised LoRA (B = 0) both halves are non-zero, so the
adapter really changes the output.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

ATTENTION_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


def build_lora(model_dir: str | os.PathLike, out_file: str | os.PathLike, rank: int = 2, seed: int = 0,
               targets: tuple[str, ...] = ATTENTION_TARGETS, strength: float = 0.5) -> Path:
    from safetensors import safe_open
    from safetensors.torch import save_file

    weights = sorted((Path(model_dir) / "transformer").glob("*.safetensors"))
    if not weights:
        raise FileNotFoundError(f"{model_dir}/transformer has no safetensors weights")
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for file in weights:
        with safe_open(str(file), "pt") as f:
            for key in f.keys():
                layer, _, kind = key.rpartition(".")
                shape = f.get_slice(key).get_shape()
                if kind != "weight" or len(shape) != 2 or not layer.endswith(targets):
                    continue
                out_features, in_features = shape
                a = torch.randn(rank, in_features, generator=generator) / in_features**0.5
                b = torch.randn(out_features, rank, generator=generator) * strength / rank**0.5
                state[f"transformer.{layer}.lora_A.weight"] = a
                state[f"transformer.{layer}.lora_B.weight"] = b
    if not state:
        raise ValueError(f"no linear weight in {model_dir}/transformer ends in one of {list(targets)}")
    out = Path(out_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out))
    return out


def build_peft_lora(model_dir: str | os.PathLike, out_dir: str | os.PathLike, targets: tuple[str, ...],
                    rank: int = 4, alpha: float = 8.0, seed: int = 0, strength: float = 0.5) -> Path:
    """A peft LoRA adapter of the causal LM in `model_dir` on the layers named by `targets` (peft's
    `target_modules`), written by peft's own `save_pretrained`: `adapter_config.json` and
    `adapter_model.safetensors`, what an AR stage's `lora_adapters` and `lora: {path}` read. Both
    halves are seeded random values (peft would start B at 0: an adapter that changes nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets)))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if ".lora_A." in name:
                param.copy_(torch.randn(param.shape, generator=generator) / param.shape[1] ** 0.5)
            elif ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * strength / rank**0.5)
    out = Path(out_dir)
    peft_model.save_pretrained(str(out), save_embedding_layers=False)  # a tied LM head: only its LoRA
    return out
