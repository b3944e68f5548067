"""Pipeline registry: which `PipelineSpec` serves a given checkpoint.

Families register under the names a checkpoint carries (a transformers `model_type` or
architecture, a diffusers `_class_name`) by calling `register_pipeline` in their
`omnistage/models/<family>/__init__.py`; out-of-tree packages do the same from a
callable exposed in the `omnistage.pipelines` entry-point group. Both are loaded on the
first lookup, so registering a family is dropping a folder in `omnistage/models/`.

`resolve(model)` tries, in order:
  1. the deploy file's `pipeline:` key;
  2. `config.json` `model_type`;
  3. `config.json` `architectures` (or the single `architecture` some authors' packages write);
  4. `model_index.json` `_class_name`;
  then steps 2-4 again against pattern keys such as "*ForCausalLM" (fallbacks);
  5. for any other diffusers folder, a single generic diffusion stage.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from omnistage.config.deploy import DeployConfig, bundled_deploy_path, load_deploy_config
from omnistage.config.deploy_fields import PipelineDeployConfig
from omnistage.config.model_files import ModelFiles
from omnistage.config.platform import detect_platform
from omnistage.config.spec import PipelineSpec, StageSpec
from omnistage.config.validation import closest

ENTRY_POINT_GROUP = "omnistage.pipelines"
FAMILY_PACKAGE = "omnistage.models"
BASE_DEPLOY = "base.yaml"
"""Bundled deploy file for pipelines whose registration names none."""

Resolver = Callable[[ModelFiles, PipelineDeployConfig], PipelineSpec]
"""Builds the spec from the model's files and the pipeline-wide deploy fields, e.g. a
thinker-only variant when `output_modalities` leaves out audio."""

# diffusers video pipelines whose class name does not say "Video".
VIDEO_PIPELINE_PREFIXES = (
    "Wan", "LTX", "Mochi", "Allegro", "Latte", "AnimateDiff", "SkyReels", "EasyAnimate", "ConsisID",
)


@dataclass(frozen=True)
class PipelineEntry:
    key: str
    target: PipelineSpec | Resolver
    deploy_config: str
    """Default deploy file: a name in omnistage/deploy/ or an absolute path."""

    def build(self, files: ModelFiles, pipeline_config: PipelineDeployConfig) -> PipelineSpec:
        if isinstance(self.target, PipelineSpec):
            return self.target
        spec = self.target(files, pipeline_config)
        if not isinstance(spec, PipelineSpec):
            raise TypeError(f"pipeline resolver for {self.key!r} returned {type(spec).__name__}, not a PipelineSpec")
        return spec


@dataclass(frozen=True)
class Resolution:
    """What `resolve_pipeline` found for a model."""

    key: str
    """The registry key that matched (the diffusers class name for the generic stage)."""
    rule: str
    """The detection rule that matched, e.g. "config.json model_type"."""
    spec: PipelineSpec
    deploy: DeployConfig
    """The deploy file in force: the user's, else the family's bundled default."""


class PipelineRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, PipelineEntry] = {}
        self._discovered = False

    def register(
        self,
        key: str,
        spec_or_resolver: PipelineSpec | Resolver,
        *,
        deploy_config: str | None = None,
        replace: bool = False,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise ValueError(f"pipeline key must be a non-empty string, got {key!r}")
        if not isinstance(spec_or_resolver, PipelineSpec) and not callable(spec_or_resolver):
            raise TypeError(f"register_pipeline({key!r}, ...) needs a PipelineSpec or a resolver callable")
        if key in self._entries and not replace:
            raise ValueError(f"pipeline {key!r} is already registered; pass replace=True to override it")
        self._entries[key] = PipelineEntry(key, spec_or_resolver, deploy_config or BASE_DEPLOY)

    def keys(self) -> list[str]:
        self.discover()
        return sorted(self._entries)

    def spec_of(self, key: str) -> PipelineSpec | None:
        """The spec registered under `key`; None for a resolver (its spec depends on the files)
        or an unknown key."""
        self.discover()
        entry = self._entries.get(key)
        return entry.target if entry is not None and isinstance(entry.target, PipelineSpec) else None

    def discover(self) -> None:
        """Import every family package, then run the entry-point plugins (once)."""
        if self._discovered:
            return
        self._discovered = True  # first: a family that resolves while importing must not recurse
        try:
            _import_families()
            load_entry_points()
        except BaseException:
            self._discovered = False
            raise

    # --- resolution --------------------------------------------------------------

    def resolve(
        self, model: str | Path, deploy: DeployConfig | str | Path | None = None, *, platform: str | None = None
    ) -> Resolution:
        self.discover()
        files = ModelFiles(str(model))
        if isinstance(deploy, (str, Path)):
            deploy = load_deploy_config(deploy)
        entry, rule = self._match(files, deploy)
        if deploy is None:
            deploy = load_deploy_config(bundled_deploy_path(entry.deploy_config))
        if platform is None:
            # Only an overlay can make the platform matter here; skip detection otherwise.
            platform = detect_platform() if deploy.platforms else "cpu"
        spec = entry.build(files, deploy.pipeline_config(platform))
        return Resolution(key=entry.key, rule=rule, spec=spec, deploy=deploy)

    def _match(self, files: ModelFiles, deploy: DeployConfig | None) -> tuple[PipelineEntry, str]:
        if deploy is not None and deploy.pipeline is not None:
            if deploy.pipeline not in self._entries:
                raise ValueError(f"{deploy.path}: pipeline: {self._unknown(deploy.pipeline)}")
            return self._entries[deploy.pipeline], f"deploy file `pipeline:` key ({deploy.path})"
        candidates = _candidates(files)
        for rule, name in candidates:
            if name in self._entries and not _is_pattern(name):
                return self._entries[name], rule
        patterns = [k for k in self._entries if _is_pattern(k)]
        for rule, name in candidates:
            for pattern in patterns:
                if fnmatch.fnmatchcase(name, pattern):
                    return self._entries[pattern], f"{rule} (pattern {pattern!r})"
        if files.model_index is not None:
            class_name = str(files.model_index.get("_class_name", "DiffusionPipeline"))
            return PipelineEntry(class_name, default_diffusion_spec(class_name), BASE_DEPLOY), "default diffusion stage"
        raise ValueError(self._no_match_message(files))

    def _unknown(self, key: str) -> str:
        guess = closest(key, self._entries)
        hint = f"; did you mean {guess!r}?" if guess else ""
        return f"unknown pipeline {key!r}{hint} (registered: {', '.join(sorted(self._entries))})"

    def _no_match_message(self, files: ModelFiles) -> str:
        if files.config is None and files.model_index is None:
            found = (
                "has neither config.json nor model_index.json"
                if files.is_local
                else "is not a local folder, and neither the Hugging Face cache nor the hub has its "
                "config.json or model_index.json"
            )
        else:
            config = files.config or {}
            found = (
                f"has config.json model_type={config.get('model_type')!r}, "
                f"architectures={config.get('architectures')!r}"
            )
        return (
            f"no pipeline for model {files.model!r}: it {found}. "
            f"Registered: {', '.join(sorted(self._entries))}. "
            "Name one with `pipeline:` in a deploy file, or register the family."
        )


def _candidates(files: ModelFiles) -> list[tuple[str, str]]:
    """(rule, name) pairs in detection order; files are read only as far as needed."""
    out: list[tuple[str, str]] = []
    config = files.config or {}
    if isinstance(config.get("model_type"), str):
        out.append(("config.json model_type", config["model_type"]))
    for arch in config.get("architectures") or []:
        if isinstance(arch, str):
            out.append(("config.json architectures", arch))
    if isinstance(config.get("architecture"), str):  # VoxCPM's config.json
        out.append(("config.json architecture", config["architecture"]))
    index = files.model_index or {}
    if isinstance(index.get("_class_name"), str):
        out.append(("model_index.json _class_name", index["_class_name"]))
    return out


def _is_pattern(key: str) -> bool:
    return any(c in key for c in "*?[")


def is_video_pipeline(class_name: str) -> bool:
    return "Video" in class_name or class_name.startswith(VIDEO_PIPELINE_PREFIXES)


def default_diffusion_spec(class_name: str) -> PipelineSpec:
    """One generic diffusion stage (model=None: the adapter around the diffusers pipeline)."""
    output = "video" if is_video_pipeline(class_name) else "image"
    stage = StageSpec(id=0, name="diffusion", kind="diffusion", output=output, final_output=True)
    return PipelineSpec(name=class_name, stages=(stage,))


def _import_families() -> None:
    # Importing a family package runs its register_pipeline calls.
    package = importlib.import_module(FAMILY_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__):
        if info.ispkg:
            importlib.import_module(f"{FAMILY_PACKAGE}.{info.name}")


def load_entry_points(entry_points: Iterable[importlib.metadata.EntryPoint] | None = None) -> None:
    """Run each `omnistage.pipelines` entry point: a callable that calls `register_pipeline`.

    `entry_points` defaults to the installed distributions' entry points in the group.
    """
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    for ep in entry_points:
        try:
            ep.load()()
        except Exception as e:
            raise RuntimeError(f"pipeline plugin {ep.name!r} ({ep.value}) failed: {e}") from e


REGISTRY = PipelineRegistry()
"""The process-wide registry that families and plugins register into."""


def register_pipeline(
    key: str, spec_or_resolver: PipelineSpec | Resolver, *, deploy_config: str | None = None, replace: bool = False
) -> None:
    """Register a pipeline under `key` (a model_type, architecture or diffusers class name).

    `spec_or_resolver` is a `PipelineSpec`, or a `Resolver` called with the model's files
    and pipeline-wide deploy fields. Keys with `*`/`?` are fnmatch patterns tried after
    every exact key (e.g. "*ForCausalLM"). `deploy_config` names the family's bundled
    deploy file in omnistage/deploy/ (or an absolute path), used when the user gives none;
    default base.yaml. Registering a taken key raises unless `replace=True`.
    """
    REGISTRY.register(key, spec_or_resolver, deploy_config=deploy_config, replace=replace)


def resolve_pipeline(
    model: str | Path, deploy: DeployConfig | str | Path | None = None, *, platform: str | None = None
) -> Resolution:
    """Find the pipeline for `model` (a local folder or a hub id); see the module docstring."""
    return REGISTRY.resolve(model, deploy, platform=platform)


def resolve(
    model: str | Path, deploy: DeployConfig | str | Path | None = None, *, platform: str | None = None
) -> PipelineSpec:
    """The `PipelineSpec` for `model`; `resolve_pipeline` also says which rule matched."""
    return REGISTRY.resolve(model, deploy, platform=platform).spec


def registered_pipelines() -> list[str]:
    """Every registered key, families and plugins loaded."""
    return REGISTRY.keys()
