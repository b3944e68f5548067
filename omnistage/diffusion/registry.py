"""Native diffusion pipelines by key (a diffusers `_class_name`); anything else runs
through the generic `__call__` adapter (generic.py).

Families register their pipeline from their torch-free `__init__.py`, next to their spec:

    register_diffusion_pipeline("ZImagePipeline", "omnistage.models.z_image.pipeline:ZImage")
"""

from __future__ import annotations

from omnistage.config.registry import REGISTRY
from omnistage.core.registry import ComponentRegistry, import_target

GENERIC_PIPELINE = "omnistage.diffusion.generic:GenericDiffusersPipeline"

_PIPELINES = ComponentRegistry("diffusion pipeline", REGISTRY.discover)


def register_diffusion_pipeline(key: str, target: str | type) -> None:
    """Run diffusion stages whose model key (`StageSpec.model`, else the checkpoint's
    `_class_name`) is `key` on `target` (a DiffusionPipelineBase subclass or "module:Class")."""
    _PIPELINES.register(key, target)


def native_keys() -> list[str]:
    """Every key a native pipeline is registered under (the families loaded first)."""
    REGISTRY.discover()
    return _PIPELINES.keys()


def is_native(key: str) -> bool:
    return key in _PIPELINES


def pipeline_class(key: str) -> type:
    """The native pipeline class registered under `key`, or the generic adapter."""
    target = _PIPELINES.find(key)
    return import_target(target if target is not None else GENERIC_PIPELINE)
