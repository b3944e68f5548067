"""Accelerations of a diffusion stage, one module each.

Every module is a small config dataclass read from the stage's deploy fields and an
`apply(pipeline, config)`; `apply_accelerations` is the one place they are applied, at
load time (`DiffusionPipelineBase.from_pretrained`), with the stage's `StageDeployConfig`.
Which of them a family takes it declares next to its code (`Accelerations`, declaration.py);
anything else is refused by name at start-up (`check_family`). A module says what it
cannot do with a given checkpoint (a head count a degree does not divide) by raising
ValueError naming the field and the family.

`NOT_YET_IMPLEMENTED` lists the deploy fields the schema accepts but no module implements
yet, with their inert values: a stage that sets one is refused before anything loads, since
silently ignoring a user's setting would be worse. Each feature that lands deletes its row.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omnistage.diffusion.accel.declaration import CACHE_BACKENDS, check_declared

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

MODULES = ("lora", "quantization", "attention_backend", "sequence_parallel", "tensor_parallel", "fsdp",
           "cfg_parallel", "first_block_cache",
           "tea_cache", "easycache", "mag_cache", "cache_dit", "vae_tiling", "vae_slicing",
           "vae_patch_parallel", "offload", "compile")
"""Modules of this package, applied in this order; each has `from_deploy` and `apply`. The
step caches come after cfg_parallel (they wrap the guidance function it installs) and
before offload and compile (which wrap the blocks the caches hook). After them all, on CPU,
`prepack` packs the blocks' plain linears (which any of them may wrap or replace); it is on by
default, no acceleration the deploy config turns on, so it is not listed among those applied."""

NOT_YET_IMPLEMENTED: dict[str, Any] = {}


def check_supported(stage_label: str, deploy: StageDeployConfig) -> None:
    """Raise ValueError naming the stage and every deploy field set that nothing implements yet."""
    unsupported = [f"{name}={getattr(deploy, name)!r}" for name, inert in NOT_YET_IMPLEMENTED.items()
                   if getattr(deploy, name) != inert]
    if unsupported:
        raise ValueError(f"stage {stage_label}: {', '.join(unsupported)} is not implemented in this version of "
                         f"omnistage; remove it from the deploy config")
    check_cache(stage_label, deploy)
    try:  # the fields tensor parallel and FSDP are not combined with, before anything loads
        importlib.import_module(f"{__name__}.tensor_parallel").from_deploy(deploy)
        importlib.import_module(f"{__name__}.fsdp").from_deploy(deploy)
    except ValueError as exc:
        raise ValueError(f"stage {stage_label}: {exc}") from None


def check_family(stage_label: str, deploy: StageDeployConfig, pipeline_cls: type) -> None:
    """Raise ValueError naming the stage, the family and every acceleration field `deploy` turns
    on that `pipeline_cls` does not declare (declaration.py)."""
    try:
        check_declared(pipeline_cls.reference_class, pipeline_cls.supported_accelerations, deploy)
    except ValueError as exc:
        raise ValueError(f"stage {stage_label}: {exc}") from None


def check_cache(stage_label: str, deploy: StageDeployConfig) -> None:
    """Raise ValueError naming `cache_backend` or the `cache_config` key that is wrong, before
    anything loads."""
    backend = deploy.cache_backend
    if backend is None:
        if deploy.cache_config:
            raise ValueError(f"stage {stage_label}: cache_config is set but cache_backend is not "
                             f"(one of {', '.join(CACHE_BACKENDS)})")
        return
    if backend not in CACHE_BACKENDS:
        raise ValueError(f"stage {stage_label}: cache_backend must be one of {', '.join(CACHE_BACKENDS)}, "
                         f"got {backend!r}")
    try:
        importlib.import_module(f"{__name__}.{backend}").from_deploy(deploy)
    except ValueError as exc:
        raise ValueError(f"stage {stage_label}: {exc}") from None


def apply_accelerations(pipeline: Any, deploy: StageDeployConfig) -> list[str]:
    """Apply every acceleration the deploy config turns on, then pack the transformer blocks'
    linears on CPU (prepack.py); the names of the accelerations applied."""
    applied = []
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        config = module.from_deploy(deploy)
        if config is not None:
            module.apply(pipeline, config)
            applied.append(name)
    prepack = importlib.import_module(f"{__name__}.prepack")
    config = prepack.from_deploy(deploy)
    if config is not None:
        prepack.apply(pipeline, config)
    return applied
