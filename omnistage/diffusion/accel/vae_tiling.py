"""`vae_use_tiling`: decode (and encode) through the diffusers VAE's own tiling, so a large
image or a long video never passes through the VAE whole: peak memory follows the tile,
not the output. diffusers blends overlapping tiles, so the output differs slightly from
an untiled decode (within the tolerance diffusers' own tiling tests use)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class VaeTilingConfig:
    """Tiling on, with the VAE's own tile sizes (from its config)."""


def from_deploy(deploy: StageDeployConfig) -> VaeTilingConfig | None:
    return VaeTilingConfig() if deploy.vae_use_tiling else None


def apply(pipeline: Any, config: VaeTilingConfig) -> None:
    vae = pipeline.components.get("vae")
    if vae is None or not hasattr(vae, "enable_tiling"):
        raise ValueError(f"vae_use_tiling: {pipeline.reference_class} has no VAE with tiled decode")
    vae.enable_tiling()
