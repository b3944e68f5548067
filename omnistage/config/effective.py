"""The effective config: topology plus every deploy layer merged by precedence.

For each stage field, from lowest to highest precedence:

    StageSpec.defaults  <  deploy file (bases first)  <  platform overlay  <  --stage-overrides

and within each layer a numbered stage entry beats its "*" entry. Then the stage's
StageSpec.hard values replace whatever the layers said: they are constraints the
pipeline cannot run without (a user value that disagrees is logged as a warning).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.config.deploy import ALL_STAGES, DeployConfig, DeployLayer, merge_fields, parse_stage_overrides
from omnistage.config.deploy_fields import PipelineDeployConfig, StageDeployConfig, stage_consistency_problems
from omnistage.config.platform import PLATFORMS, detect_platform
from omnistage.config.registry import resolve_pipeline
from omnistage.config.spec import PipelineSpec, StageSpec
from omnistage.config.validation import format_problems, unknown_key

logger = logging.getLogger(__name__)

PIPELINE_DEFAULTS = "pipeline defaults"


@dataclass(frozen=True)
class EffectiveConfig:
    """Everything an engine launch needs: the topology and the merged deploy fields."""

    pipeline: PipelineSpec
    pipeline_config: PipelineDeployConfig
    """Pipeline-wide deploy fields."""
    stage_configs: Mapping[int, StageDeployConfig]
    """Per-stage deploy fields, by stage id (every stage of `pipeline` has one)."""
    platform: str
    """The platform whose overlay was applied."""
    deploy_file: Path | None = None
    """The deploy file in force (the user's or the family's bundled default)."""
    model: str | None = None
    pipeline_key: str | None = None
    """Registry key that matched the model."""
    resolved_by: str | None = None
    """The detection rule that matched, e.g. "model_index.json _class_name"."""

    def stage_config(self, stage_id: int) -> StageDeployConfig:
        return self.stage_configs[stage_id]

    def to_dict(self) -> dict[str, Any]:
        """Plain data (lists, dicts, strings) for `omnistage config show`."""
        return {
            "model": self.model,
            "pipeline": {
                "key": self.pipeline_key,
                "resolved_by": self.resolved_by,
                "name": self.pipeline.name,
                "stages": [_stage_spec_dict(s) for s in self.pipeline.stages],
                "request_extras": sorted(self.pipeline.request_extras),
            },
            "deploy_file": str(self.deploy_file) if self.deploy_file else None,
            "platform": self.platform,
            "pipeline_config": _plain(dataclasses.asdict(self.pipeline_config)),
            "stages": {sid: _plain(dataclasses.asdict(cfg)) for sid, cfg in self.stage_configs.items()},
        }


def resolve_config(
    model: str | Path,
    deploy_config: DeployConfig | str | Path | None = None,
    *,
    stage_overrides: str | Mapping[str, Any] | None = None,
    platform: str | None = None,
) -> EffectiveConfig:
    """Resolve `model`'s pipeline and merge its deploy layers: what `serve` and `Omni` start from.

    `deploy_config` is a path or a loaded `DeployConfig`; None uses the family's bundled
    file. `stage_overrides` is the `--stage-overrides` JSON (or its parsed dict).
    `platform` defaults to the detected one.
    """
    platform = platform or detect_platform()
    resolution = resolve_pipeline(model, deploy_config, platform=platform)
    config = build_effective_config(
        resolution.spec, resolution.deploy, platform=platform, stage_overrides=stage_overrides
    )
    return dataclasses.replace(config, model=str(model), pipeline_key=resolution.key, resolved_by=resolution.rule)


def build_effective_config(
    spec: PipelineSpec,
    deploy: DeployConfig | None = None,
    *,
    platform: str | None = None,
    stage_overrides: str | Mapping[str, Any] | DeployLayer | None = None,
) -> EffectiveConfig:
    """Merge `deploy` and `stage_overrides` over `spec`'s stage defaults (see module docstring).

    Raises one ValueError listing every problem: unknown platform, a layer naming a stage
    the pipeline lacks, and per-stage rules such as parallel degrees vs num_devices.
    """
    platform = platform or detect_platform()
    if platform not in PLATFORMS:
        raise ValueError(f"platform: {unknown_key(platform, PLATFORMS, 'platform')}")
    deploy = deploy or DeployConfig(path=None)
    cli = stage_overrides if isinstance(stage_overrides, DeployLayer) else parse_stage_overrides(stage_overrides)
    layers = [*deploy.layers(platform), cli]

    problems = [p for layer in layers for p in _unknown_stage_problems(spec, layer)]
    stage_values = {stage.id: _merge_stage(stage, layers) for stage in spec.stages}
    for stage in spec.stages:
        problems += [f"stage {stage.label}: {p}" for p in stage_consistency_problems(stage_values[stage.id])]
    if problems:
        raise ValueError(format_problems(f"invalid deploy config for pipeline {spec.name!r}:", problems))

    return EffectiveConfig(
        pipeline=spec,
        pipeline_config=deploy.pipeline_config(platform),
        stage_configs={sid: StageDeployConfig(**values) for sid, values in stage_values.items()},
        platform=platform,
        deploy_file=deploy.path,
    )


def _merge_stage(stage: StageSpec, layers: list[DeployLayer]) -> dict[str, Any]:
    values = dict(stage.defaults)
    origins = dict.fromkeys(values, PIPELINE_DEFAULTS)
    for layer in layers:
        given = layer.fields_for(stage.id)
        values = merge_fields(values, given)
        origins.update(dict.fromkeys(given, layer.origin))
    for key, forced in stage.hard.items():
        if key in values and origins.get(key, PIPELINE_DEFAULTS) != PIPELINE_DEFAULTS and values[key] != forced:
            logger.warning(
                "stage %s: %s=%r from %s conflicts with the pipeline's hard constraint %s=%r; using %r",
                stage.label, key, values[key], origins[key], key, forced, forced,
            )
        values[key] = forced
    return values


def _unknown_stage_problems(spec: PipelineSpec, layer: DeployLayer) -> list[str]:
    ids = set(spec.stage_ids)
    return [
        f"{layer.origin}: stage {key}: pipeline {spec.name!r} has no such stage (stages: {spec.describe_stages()})"
        for key in layer.stage_fields
        if key != ALL_STAGES and key not in ids and key not in spec.dropped_stages
    ]


def _stage_spec_dict(stage: StageSpec) -> dict[str, Any]:
    return {
        "id": stage.id,
        "name": stage.name,
        "kind": stage.kind,
        "inputs": list(stage.inputs),
        "output": stage.output,
        "final_output": stage.final_output,
        "stream_input": stage.stream_input,
        "model": stage.model,
        "input_processor": _callable_name(stage.input_processor),
        "chunk_processor": _callable_name(stage.chunk_processor),
        "defaults": _plain(dict(stage.defaults)),
        "hard": _plain(dict(stage.hard)),
    }


def _callable_name(fn: Any) -> str | None:
    if fn is None:
        return None
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
