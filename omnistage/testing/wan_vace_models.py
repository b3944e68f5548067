"""Wan-VACE zoo builder: `WanVACEPipeline`, the tiny Wan 2.1 T2V components with a
`WanVACETransformer3DModel` (control blocks beside every other DiT block)."""

from __future__ import annotations

from pathlib import Path

from omnistage.testing.diffusion_components import save_pipeline, seed_everything
from omnistage.testing.diffusion_models import _T2V_DEFAULTS, SIZES, VIDEO_SIDE, _wan_components
from omnistage.testing.zoo import ZooModel, register_zoo_model


def build_wan_vace(out_dir: Path, size: str, seed: int) -> None:
    from diffusers import WanVACEPipeline

    seed_everything(seed)
    save_pipeline(WanVACEPipeline(**_wan_components(size, in_channels=16, vace=True)), out_dir)


register_zoo_model(
    ZooModel(
        name="wan-vace",
        kind="diffusion",
        reference_class="diffusers.WanVACEPipeline",
        builder=build_wan_vace,
        sizes=SIZES,
        description="Wan 2.1 VACE: Wan T2V plus control blocks over a control video, its mask and reference images",
        # Text only here; tests add reference_images=, video= and mask= (lists of PIL images).
        call_kwargs=dict(_T2V_DEFAULTS),
        sides=VIDEO_SIDE,
    )
)
