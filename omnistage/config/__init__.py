"""What a model *is* (pipeline topology) and how it is *deployed* (deploy files).

- `PipelineSpec` / `StageSpec` (spec.py): the frozen stage graph, validated on construction.
- `register_pipeline` / `resolve` / `resolve_pipeline` (registry.py): which pipeline serves a
  checkpoint; families register in omnistage/models/<family>/, plugins through the
  `omnistage.pipelines` entry-point group.
- `DeployConfig` / `load_deploy_config` / `parse_stage_overrides` (deploy.py): YAML deploy
  files with `base_config:` inheritance and `platforms:` overlays, and `--stage-overrides`.
- `StageDeployConfig` / `PipelineDeployConfig` (deploy_fields.py): the deploy fields.
- `resolve_config` / `build_effective_config` -> `EffectiveConfig` (effective.py): the
  topology plus every layer merged by precedence; what `serve` and `Omni` start from.
"""

from omnistage.config.deploy import ALL_STAGES, DeployConfig, DeployLayer, load_deploy_config, parse_stage_overrides
from omnistage.config.deploy_fields import PipelineDeployConfig, StageDeployConfig
from omnistage.config.effective import EffectiveConfig, build_effective_config, resolve_config
from omnistage.config.model_files import ModelFiles
from omnistage.config.platform import PLATFORMS, detect_platform
from omnistage.config.registry import (
    Resolution,
    load_entry_points,
    register_pipeline,
    registered_pipelines,
    resolve,
    resolve_pipeline,
)
from omnistage.config.spec import MODALITIES, STAGE_KINDS, Duplex, PipelineSpec, SpeechToText, StageSpec

__all__ = [
    "ALL_STAGES",
    "MODALITIES",
    "PLATFORMS",
    "STAGE_KINDS",
    "DeployConfig",
    "DeployLayer",
    "Duplex",
    "EffectiveConfig",
    "ModelFiles",
    "PipelineDeployConfig",
    "PipelineSpec",
    "SpeechToText",
    "Resolution",
    "StageDeployConfig",
    "StageSpec",
    "build_effective_config",
    "detect_platform",
    "load_deploy_config",
    "load_entry_points",
    "parse_stage_overrides",
    "register_pipeline",
    "registered_pipelines",
    "resolve",
    "resolve_config",
    "resolve_pipeline",
]
