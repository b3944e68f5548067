"""`vae_use_slicing`: a batch's VAE decode (and encode) runs one sample at a time (diffusers'
slicing, `enable_slicing`), so the VAE's activations follow one sample, not the batch of
requests decoded together. The output is the batched call's (to float rounding). Our
pipelines already encode each input image alone, so in practice it is the decode of a batch
that it splits. Off by default, as in diffusers: one batched call is the faster where memory
allows it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class VaeSlicingConfig:
    """Slicing on."""


def from_deploy(deploy: StageDeployConfig) -> VaeSlicingConfig | None:
    return VaeSlicingConfig() if deploy.vae_use_slicing else None


def apply(pipeline: Any, config: VaeSlicingConfig) -> None:
    vae = pipeline.components.get("vae")
    if vae is None or not hasattr(vae, "enable_slicing"):
        raise ValueError(f"vae_use_slicing: {pipeline.reference_class} has no VAE with sliced encode and decode")
    vae.enable_slicing()
