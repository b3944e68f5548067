"""A tiny GGUF of a zoo checkpoint's transformer, as the community's GGUF files are made.

`build_transformer_gguf(model_dir, out_file)` reads a zoo Z-Image folder's transformer,
renames its weights back to the original (single-file) layout that diffusers'
`from_single_file` converts from (fused `attention.qkv`, `attention.out`, `q_norm`, ...),
and writes them with the `gguf` package: Linear weights whose rows split into 32-value
blocks as Q8_0 (one fp16 scale per block), the rest (norms, pad tokens) as F32 (llama.cpp's tools keep norms and odd
shapes in full precision too). Only Z-Image's layout is written: it is the family the
GGUF test loads.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

Z_IMAGE_ORIGINAL_NAMES = {  # diffusers name part -> the original checkpoint's
    "all_final_layer.2-1.": "final_layer.",
    "all_x_embedder.2-1.": "x_embedder.",
    ".attention.to_out.0.": ".attention.out.",
    ".attention.norm_k.": ".attention.k_norm.",
    ".attention.norm_q.": ".attention.q_norm.",
}


def z_image_original_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Z-Image's diffusers state dict in the original layout (the inverse of diffusers'
    `convert_z_image_transformer_checkpoint_to_diffusers`)."""
    out = {}
    for name, tensor in state.items():
        if ".attention.to_k." in name or ".attention.to_v." in name:
            continue  # fused into qkv below
        if ".attention.to_q." in name:
            parts = [state[name.replace(".to_q.", f".to_{p}.")] for p in "qkv"]
            out[name.replace(".to_q.", ".qkv.")] = torch.cat(parts)
            continue
        for ours, original in Z_IMAGE_ORIGINAL_NAMES.items():
            name = name.replace(ours, original)
        out[name] = tensor
    return out


def build_transformer_gguf(model_dir: str | os.PathLike, out_file: str | os.PathLike) -> Path:
    import gguf
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for file in sorted((Path(model_dir) / "transformer").glob("*.safetensors")):
        state.update(load_file(file))
    q8 = gguf.GGMLQuantizationType.Q8_0
    block, _ = gguf.GGML_QUANT_SIZES[q8]
    writer = gguf.GGUFWriter(str(out_file), arch="z_image")
    for name, tensor in z_image_original_state(state).items():
        array = tensor.float().numpy()
        if name.endswith(".weight") and array.ndim == 2 and array.shape[-1] % block == 0:  # Linear weights
            writer.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out_file)
