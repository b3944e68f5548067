"""`transformer_file`: the transformer loaded from one file in place of the folder's own.

A `.gguf` file (the community's quantized DiT checkpoints: Q8_0, Q4_K, ...) loads through
diffusers' single-file loader with `GGUFQuantizationConfig`: the weights stay quantized in
memory and each Linear dequantizes its weight to the stage's dtype as it runs. The file
holds weights only; the architecture comes from the folder's `transformer/config.json`,
and the rest of the pipeline (text encoders, VAE, scheduler) from the folder as usual.

An SVDQuant (Nunchaku) checkpoint is refused by name: its W4A4 layers (`qweight`,
`wscales`, `smooth_factor`, `proj_down` / `proj_up`) run only in Nunchaku's CUDA kernels,
which this build does not include and a CPU cannot run. So is a transformer class
diffusers cannot load from a single file, and `quantization` on top of GGUF weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from omnistage.config.deploy_fields import StageDeployConfig

SVDQUANT_TENSORS = ("wscales", "smooth_factor", "proj_down", "proj_up")
"""Per-linear tensors only an SVDQuant checkpoint holds."""
SVDQUANT_REASON = ("its W4A4 layers run only in Nunchaku's CUDA kernels (the nunchaku package), "
                   "which this build of omnistage does not include and a CPU cannot run")


def transformer_class(path: str) -> Any:
    """The diffusers class of the folder's `transformer` component (model_index.json)."""
    import diffusers

    index = json.loads((Path(path) / "model_index.json").read_text())
    if "transformer" not in index:
        raise ValueError(f"transformer_file: {path} has no transformer component to replace")
    _, name = index["transformer"]
    return getattr(diffusers, name)


def is_svdquant(file: Path) -> bool:
    if file.suffix != ".safetensors":
        return False
    from safetensors import safe_open

    with safe_open(str(file), "pt") as f:
        return any(key.rsplit(".", 1)[-1] in SVDQUANT_TENSORS for key in f.keys())


def check(path: str, deploy: StageDeployConfig) -> Path:
    """The file, or ValueError naming `transformer_file` and why it cannot be loaded."""
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

    file = Path(deploy.transformer_file)
    if not file.is_file():
        raise ValueError(f"transformer_file: no such file {str(file)!r}")
    if is_svdquant(file):
        raise ValueError(f"transformer_file: {file.name} is an SVDQuant (Nunchaku) checkpoint: {SVDQUANT_REASON}")
    if file.suffix != ".gguf":
        raise ValueError(f"transformer_file: {file.name} is not a .gguf file (the one single-file format loaded)")
    if deploy.quantization is not None:
        raise ValueError(f"transformer_file: a GGUF file is quantized already; remove "
                         f"quantization={deploy.quantization!r}")
    cls = transformer_class(path)
    if cls.__name__ not in SINGLE_FILE_LOADABLE_CLASSES:
        raise ValueError(f"transformer_file: diffusers cannot load {cls.__name__} from a single file")
    return file


def load(path: str, deploy: StageDeployConfig, dtype: torch.dtype) -> Any:
    """The transformer from `deploy.transformer_file`, its config from the folder at `path`."""
    from diffusers import GGUFQuantizationConfig

    file = check(path, deploy)
    return transformer_class(path).from_single_file(
        str(file), config=str(path), subfolder="transformer", torch_dtype=dtype,
        quantization_config=GGUFQuantizationConfig(compute_dtype=dtype))
