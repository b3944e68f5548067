"""What a bare request gets: the effective request defaults of each stage, for /v1/models.

They are built as the engine builds them, from the same declarations: an AR stage's
`SamplingParams` from the deploy's `default_sampling_params` (the rest: SamplingParams'
own defaults); a native diffusion stage's params filled by `fill_defaults` from the deploy
defaults, then the family's `request_defaults()` read from the checkpoint's config files
(no weights loaded). A request's own fields win over all of them. A stage whose engine
picks its defaults only once loaded (the generic diffusers adapter) lists the deploy
values alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def effective_defaults(engine: Any) -> dict[str, dict[str, Any]]:
    """{stage name: {field: value}} for every stage of `engine.spec` (None: {})."""
    if engine is None:
        return {}
    config = getattr(engine, "config", None)  # AsyncOmni's merged deploy config; None for bare clients
    paths = _model_paths(config, engine.spec)
    out = {}
    for stage in engine.spec.stages:
        deploy = dict(config.stage_config(stage.id).default_sampling_params) if config is not None else {}
        out[stage.name] = _stage_defaults(stage, deploy, paths.get(stage.id))
    return out


def _model_paths(config: Any, spec: Any) -> dict[int, str]:
    if config is None or config.model is None:
        return {}
    from omnistage.engine.factory import stage_model_paths

    return stage_model_paths(config.model, spec)


def _stage_defaults(stage: Any, deploy: dict[str, Any], model_path: str | None) -> dict[str, Any]:
    if stage.kind == "ar":
        from omnistage.ar.sampling_params import SamplingParams

        return dataclasses.asdict(SamplingParams.from_dict(deploy))  # the AR engine's `default_params`
    if stage.kind != "diffusion" or stage.model is None:
        return deploy
    from omnistage.diffusion.registry import is_native

    if not is_native(stage.model):
        return deploy
    from omnistage.diffusion.checkpoint import CheckpointConfigs
    from omnistage.diffusion.params import DiffusionParams, fill_defaults
    from omnistage.diffusion.registry import pipeline_class

    cls = pipeline_class(stage.model)
    configs = cls.read_configs(model_path) if model_path is not None else CheckpointConfigs({}, {})
    family = cls.for_requests(configs).request_defaults()
    filled = fill_defaults(DiffusionParams(), deploy, family).model_dump(exclude_unset=True)
    if not filled.get("extras"):
        filled.pop("extras", None)
    return filled
