"""Helpers the acceleration tests share: load a zoo family with deploy fields, run one
request through `denoise` (the body of `forward`), compare to the plain run."""

from __future__ import annotations

import numpy as np

from omnistage.config.deploy_fields import StageDeployConfig
from omnistage.diffusion.pipeline import DiffusionPipelineBase
from omnistage.diffusion.registry import pipeline_class
from omnistage.testing import call_kwargs as zoo_call_kwargs

from parity import request_for

FAMILIES = {  # zoo name -> diffusers class name
    "z-image": "ZImagePipeline",
    "flux": "FluxPipeline",
    "qwen-image": "QwenImagePipeline",
    "sd3": "StableDiffusion3Pipeline",
    "wan-t2v": "WanPipeline",
}


def load(name: str, path, **deploy_fields) -> DiffusionPipelineBase:
    return pipeline_class(FAMILIES[name]).from_pretrained(path, deploy=StageDeployConfig(**deploy_fields))


def call_kwargs(name: str, **overrides) -> dict:
    return dict(zoo_call_kwargs(name), num_inference_steps=2, **overrides)


def run(pipeline: DiffusionPipelineBase, name: str, seed: int = 3, **overrides) -> np.ndarray:
    (arr,) = pipeline.decode_arrays(pipeline.denoise([request_for(call_kwargs(name, **overrides), seed)]))
    return arr


def psnr(got: np.ndarray, want: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two float images in [0, 1] (inf when equal)."""
    mse = float(np.mean((got.astype(np.float64) - want.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(1.0 / mse)
