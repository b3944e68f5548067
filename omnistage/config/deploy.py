"""Deploy files: load YAML, follow `base_config:`, merge, and read `--stage-overrides`.

A deploy file looks like this (the bundled ones in omnistage/deploy/ show every field):

    base_config: base.yaml          # relative to this file, or bundled:NAME.yaml
    pipeline: QwenImagePipeline     # optional: a registry key that beats detection
    connector: inline               # pipeline-wide fields (PipelineDeployConfig)
    stages:                         # per-stage fields (StageDeployConfig), by stage id
      - id: "*"                     # every stage; a numbered entry beats it
        dtype: bfloat16
      - id: 0
        max_num_seqs: 4
    platforms:                      # overlays for the detected platform
      cpu:
        stages:
          - id: 0
            dtype: float32

Every value is checked when its file is read, so an error names the file, the stage and
the key. Which layer wins is decided later, in effective.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from omnistage.config.deploy_fields import (
    MERGED_MAPPING_FIELDS,
    PIPELINE_CONSTRAINTS,
    PIPELINE_FIELDS,
    STAGE_CONSTRAINTS,
    STAGE_FIELDS,
    PipelineDeployConfig,
    StageDeployConfig,
)
from omnistage.config.platform import PLATFORMS
from omnistage.config.validation import check_fields, format_problems, unknown_key

ALL_STAGES = "*"
"""Stage key meaning every stage of the pipeline."""
StageKey = int | str  # a stage id, or ALL_STAGES

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "deploy"
"""Where the bundled per-family deploy files live (packaged as omnistage/deploy/*.yaml)."""
BUNDLED_PREFIX = "bundled:"

_OVERLAY_KEYS = ("stages", *PIPELINE_FIELDS)
_FILE_KEYS = ("base_config", "pipeline", "platforms", *_OVERLAY_KEYS)


@dataclass(frozen=True)
class DeployLayer:
    """Deploy values from one source (a file, a platform overlay, the CLI), not yet merged
    with the other sources."""

    origin: str
    """Where the values came from, for messages: a file path, "PATH platforms.cuda", "--stage-overrides"."""
    pipeline_fields: Mapping[str, Any] = field(default_factory=dict)
    """PipelineDeployConfig fields this layer sets."""
    stage_fields: Mapping[StageKey, Mapping[str, Any]] = field(default_factory=dict)
    """StageDeployConfig fields this layer sets, by stage id or ALL_STAGES."""

    def fields_for(self, stage_id: int) -> dict[str, Any]:
        """This layer's fields for one stage: its ALL_STAGES entry, then its own entry on top."""
        return merge_fields(self.stage_fields.get(ALL_STAGES, {}), self.stage_fields.get(stage_id, {}))


@dataclass(frozen=True)
class DeployConfig:
    """A deploy file with its `base_config:` chain merged in. Build with `load_deploy_config`."""

    path: Path | None
    """The file the user named (None for an empty config)."""
    pipeline: str | None = None
    """Registry key that overrides pipeline detection (`pipeline:`)."""
    body: DeployLayer = field(default_factory=lambda: DeployLayer(origin="(no deploy file)"))
    """The file's own fields, outside `platforms:`."""
    platforms: Mapping[str, DeployLayer] = field(default_factory=dict)
    """`platforms:` overlays by platform name."""

    def layers(self, platform: str) -> list[DeployLayer]:
        """The file's layers for `platform`, lowest precedence first."""
        overlay = self.platforms.get(platform)
        return [self.body] if overlay is None else [self.body, overlay]

    def pipeline_config(self, platform: str) -> PipelineDeployConfig:
        """The pipeline-wide fields for `platform` (overlay over file over defaults)."""
        values: dict[str, Any] = {}
        for layer in self.layers(platform):
            values.update(layer.pipeline_fields)
        return PipelineDeployConfig(**values)


def load_deploy_config(path: str | Path) -> DeployConfig:
    """Read a deploy YAML file and its `base_config:` chain into one `DeployConfig`.

    Raises ValueError listing every problem in every file of the chain (unknown keys with
    a did-you-mean, wrong types, out-of-range values, a missing base, a base cycle).
    """
    problems: list[str] = []
    config = _load(Path(path).expanduser().resolve(), (), problems)
    if problems or config is None:
        raise ValueError(format_problems(f"invalid deploy config {path}:", problems))
    return config


def bundled_deploy_path(name: str) -> Path:
    """Path of a bundled deploy file, e.g. "qwen_image.yaml"."""
    return BUNDLED_DIR / name


def parse_stage_overrides(overrides: str | Mapping[str, Any] | None) -> DeployLayer:
    """`--stage-overrides '{"0": {"max_num_seqs": 4}, "*": {"dtype": "float32"}}'` as a layer.

    Keys are stage ids as strings (JSON object keys are strings) or "*" for every stage.
    """
    origin = "--stage-overrides"
    if overrides is None:
        return DeployLayer(origin=origin)
    if isinstance(overrides, str):
        try:
            overrides = json.loads(overrides)
        except json.JSONDecodeError as e:
            raise ValueError(f"{origin}: not valid JSON: {e}") from None
    if not isinstance(overrides, Mapping):
        raise ValueError(f'{origin}: expected a JSON object like {{"0": {{"max_num_seqs": 4}}}}, got {overrides!r}')
    problems: list[str] = []
    stage_fields: dict[StageKey, dict[str, Any]] = {}
    for raw_key, values in overrides.items():
        key = _stage_key(raw_key)
        if key is None:
            problems.append(f"stage key {raw_key!r} is not a stage id or {ALL_STAGES!r}")
        elif key in stage_fields:
            problems.append(f"stage {key} given twice")
        elif not isinstance(values, Mapping):
            problems.append(f"stage {key}: expected an object of deploy fields, got {values!r}")
        else:
            converted, field_problems = check_fields(StageDeployConfig, values, STAGE_CONSTRAINTS)
            problems += [f"stage {key}: {p}" for p in field_problems]
            stage_fields[key] = converted
    if problems:
        raise ValueError(format_problems(f"invalid {origin}:", problems))
    return DeployLayer(origin=origin, stage_fields=stage_fields)


def merge_fields(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    """Stage fields of `high` over those of `low`; MERGED_MAPPING_FIELDS merge key by key."""
    out = dict(low)
    for key, value in high.items():
        if key in MERGED_MAPPING_FIELDS and isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# --- loading ----------------------------------------------------------------------------


def _load(path: Path, chain: tuple[Path, ...], problems: list[str]) -> DeployConfig | None:
    if path in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(path):], path))
        problems.append(f"base_config cycle: {cycle}")
        return None
    if not path.is_file():
        problems.append(f"{path}: no such file")
        return None
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        problems.append(f"{path}: not valid YAML: {e}")
        return None
    doc = {} if doc is None else doc
    if not isinstance(doc, Mapping):
        problems.append(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
        return None
    config, base_ref = _parse_file(doc, str(path), problems)
    if base_ref is None:
        return config
    base_path = _base_path(base_ref, path.parent)
    base = _load(base_path, (*chain, path), problems)
    return None if base is None or config is None else _merge_configs(base, config)


def _base_path(ref: str, directory: Path) -> Path:
    if ref.startswith(BUNDLED_PREFIX):
        return bundled_deploy_path(ref[len(BUNDLED_PREFIX):])
    return (directory / Path(ref).expanduser()).resolve()  # absolute refs stay absolute


def _parse_file(doc: Mapping[str, Any], origin: str, problems: list[str]) -> tuple[DeployConfig | None, str | None]:
    """One file's document (bases not followed) -> (config, base_config ref)."""
    before = len(problems)
    for key in doc:
        if key not in _FILE_KEYS:
            problems.append(f"{origin}: {_unknown_top_key(key, _FILE_KEYS)}")
    base_ref = doc.get("base_config")
    if base_ref is not None and not isinstance(base_ref, str):
        problems.append(f"{origin}: base_config: expected a path string, got {base_ref!r}")
        base_ref = None
    pipeline = doc.get("pipeline")
    if pipeline is not None and not isinstance(pipeline, str):
        problems.append(f"{origin}: pipeline: expected a registry key string, got {pipeline!r}")
    body = _parse_layer(doc, origin, problems)
    platforms: dict[str, DeployLayer] = {}
    raw_platforms = doc.get("platforms") or {}
    if not isinstance(raw_platforms, Mapping):
        problems.append(f"{origin}: platforms: expected a mapping of platform name to overlay")
        raw_platforms = {}
    for name, overlay in raw_platforms.items():
        where = f"{origin} platforms.{name}"
        if name not in PLATFORMS:
            problems.append(f"{origin}: platforms: {unknown_key(name, PLATFORMS, 'platform')}")
        elif not isinstance(overlay, Mapping):
            problems.append(f"{where}: expected a mapping, got {overlay!r}")
        else:
            for key in overlay:
                if key not in _OVERLAY_KEYS:
                    problems.append(f"{where}: {_unknown_top_key(key, _OVERLAY_KEYS)}")
            platforms[name] = _parse_layer(overlay, where, problems)
    if len(problems) > before:
        return None, base_ref
    return DeployConfig(path=Path(origin), pipeline=pipeline, body=body, platforms=platforms), base_ref


def _parse_layer(doc: Mapping[str, Any], origin: str, problems: list[str]) -> DeployLayer:
    """The pipeline-wide fields and `stages:` entries of a file body or an overlay."""
    given = {k: v for k, v in doc.items() if k in PIPELINE_FIELDS}
    pipeline_fields, field_problems = check_fields(PipelineDeployConfig, given, PIPELINE_CONSTRAINTS)
    problems += [f"{origin}: {p}" for p in field_problems]
    stage_fields: dict[StageKey, dict[str, Any]] = {}
    entries = doc.get("stages") or []
    if not isinstance(entries, list):
        problems.append(f"{origin}: stages: expected a list of entries with an `id:`, got {type(entries).__name__}")
        entries = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or "id" not in entry:
            problems.append(f"{origin}: stages[{n}]: expected a mapping with an `id:` (a stage id or '*')")
            continue
        key = entry["id"] if _is_stage_key(entry["id"]) else None
        if key is None:
            problems.append(f"{origin}: stages[{n}]: id {entry['id']!r} is not a stage id or '*'")
            continue
        if key in stage_fields:
            problems.append(f"{origin}: stage {key}: listed twice under stages:")
            continue
        values = {k: v for k, v in entry.items() if k != "id"}
        converted, field_problems = check_fields(StageDeployConfig, values, STAGE_CONSTRAINTS)
        problems += [f"{origin}: stage {key}: {p}" for p in field_problems]
        stage_fields[key] = converted
    return DeployLayer(origin=origin, pipeline_fields=pipeline_fields, stage_fields=stage_fields)


def _unknown_top_key(key: Any, valid: tuple[str, ...]) -> str:
    if key in STAGE_FIELDS:
        return f"{key!r} is a per-stage field: set it in a `stages:` entry (`id: '*'` for every stage)"
    return unknown_key(str(key), valid)


# --- merging ----------------------------------------------------------------------------


def _merge_configs(base: DeployConfig, child: DeployConfig) -> DeployConfig:
    """`child` inherits from `base`: fields merge one by one, stages by id, platforms by name."""
    platforms = dict(base.platforms)
    for name, overlay in child.platforms.items():
        platforms[name] = _merge_layers(platforms[name], overlay) if name in platforms else overlay
    return DeployConfig(
        path=child.path,
        pipeline=child.pipeline if child.pipeline is not None else base.pipeline,
        body=_merge_layers(base.body, child.body),
        platforms=platforms,
    )


def _merge_layers(low: DeployLayer, high: DeployLayer) -> DeployLayer:
    stage_fields = {key: dict(values) for key, values in low.stage_fields.items()}
    for key, values in high.stage_fields.items():
        stage_fields[key] = merge_fields(stage_fields.get(key, {}), values)
    return DeployLayer(
        origin=high.origin,
        pipeline_fields={**low.pipeline_fields, **high.pipeline_fields},
        stage_fields=stage_fields,
    )


def _deep_merge(low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(low)
    for key, value in high.items():
        if isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _is_stage_key(value: Any) -> bool:
    return value == ALL_STAGES or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _stage_key(raw: Any) -> StageKey | None:
    """A CLI key ("0", "*") as a stage key, or None if it is neither."""
    if raw == ALL_STAGES:
        return ALL_STAGES
    if isinstance(raw, str) and raw.isascii() and raw.isdigit():
        return int(raw)
    return raw if _is_stage_key(raw) else None
