"""What a bare request gets: the effective request defaults of each stage, for /v1/models.

Per stage, lowest precedence first: the engine's own defaults (a native diffusion
pipeline's call defaults and its declared extras' defaults, read from the class without
loading it; `SamplingParams`' defaults for AR stages), then the deploy file's
`default_sampling_params`. A request's own fields win over all of them. A stage whose
engine picks its defaults only once loaded (the generic diffusers adapter) lists the
deploy values alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any



def effective_defaults(engine: Any) -> dict[str, dict[str, Any]]:
    """{stage name: {field: value}} for every stage of `engine.spec` (None: {})."""
    if engine is None:
        return {}
    out = {}
    for stage in engine.spec.stages:
        own, deploy = _engine_defaults(stage), _deploy_defaults(engine, stage.id)
        merged = {**own, **deploy}
        if "extras" in own and "extras" in deploy:
            merged["extras"] = {**own["extras"], **deploy["extras"]}
        out[stage.name] = merged
    return out


def _deploy_defaults(engine: Any, stage_id: int) -> dict[str, Any]:
    """The stage's deploy `default_sampling_params` (AsyncOmni's `config`; {} for clients without one)."""
    config = getattr(engine, "config", None)
    if config is None:
        return {}
    return dict(config.stage_config(stage_id).default_sampling_params)


def _engine_defaults(stage: Any) -> dict[str, Any]:
    if stage.kind == "ar":
        from omnistage.ar.sampling_params import SamplingParams

        return dataclasses.asdict(SamplingParams())
    if stage.kind != "diffusion" or stage.model is None:
        return {}
    from omnistage.diffusion.registry import is_native, pipeline_class

    if not is_native(stage.model):
        return {}
    cls = pipeline_class(stage.model)
    extras = {name: spec.default for name, spec in cls.extras.items() if spec.default is not None}
    return {**cls.default_params, **({"extras": extras} if extras else {})}
