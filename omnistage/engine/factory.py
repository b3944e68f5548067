"""Which engine class runs which stage kind, imported only when a stage needs it.

An engine factory is any callable `(model_path, stage, config) -> Engine`; every engine
class has that constructor, so a class is a factory. The orchestrator takes a factory
argument (default `create_engine`) so tests can run the real routing over fake engines.
A factory for process stages must be picklable (a module-level function or class).
`stage_model_paths` says which checkpoint each stage's engine loads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from omnistage.core.registry import import_target

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.config.spec import PipelineSpec, StageSpec
    from omnistage.core.types import Engine, StageRequest

EngineFactory = Callable[[str, "StageSpec", "StageDeployConfig"], "Engine"]

ENGINE_CLASSES = {
    "ar": "omnistage.ar.engine:AREngine",
    "diffusion": "omnistage.diffusion.engine:DiffusionEngine",
    "generation": "omnistage.generation.engine:GenerationEngine",
}

AR_BACKENDS = {
    "native": ENGINE_CLASSES["ar"],
    "vllm": "omnistage.ar.vllm_backend:VLLMAREngine",
}
"""`StageDeployConfig.ar_backend` -> the engine class of an AR stage."""


def get_engine_class(kind: str, ar_backend: str = "native") -> type:
    """The engine class for stage kind `kind` (and, for AR stages, `ar_backend`); imports its module now."""
    if kind not in ENGINE_CLASSES:
        raise ValueError(f"no engine for stage kind {kind!r}; known kinds: {', '.join(ENGINE_CLASSES)}")
    if kind == "ar" and ar_backend not in AR_BACKENDS:
        raise ValueError(f"no AR backend {ar_backend!r}; known backends: {', '.join(AR_BACKENDS)}")
    return import_target(AR_BACKENDS[ar_backend] if kind == "ar" else ENGINE_CLASSES[kind])


NOT_YET_IMPLEMENTED = {
    "offload": None, "quantization": None, "ignored_layers": (), "lora": None, "lora_adapters": {}, "max_loras": 0,
    "compile": False, "attention_backend": "sdpa", "tensor_parallel_size": 1,
}
"""Deploy fields of AR and generation stages that the schema accepts but no engine of theirs
implements yet, with their inert values. A stage that sets one is refused: silently ignoring
a user's setting would be worse. (Diffusion stages: omnistage/diffusion/accel/, where the
diffusion engine checks its own.)"""

_BACKEND_IMPLEMENTS = {"vllm": {"tensor_parallel_size", "compile"},
                       "native": {"compile", "quantization", "ignored_layers", "lora_adapters", "max_loras"}}
"""Fields an AR backend implements itself (it checks the rest of NOT_YET_IMPLEMENTED)."""


def check_implemented(stage: StageSpec, config: StageDeployConfig) -> None:
    """Raise ValueError naming the stage and every deploy field set that nothing implements yet."""
    if stage.kind == "diffusion":
        return  # the diffusion engine checks its fields against its accelerations
    implemented = _BACKEND_IMPLEMENTS.get(config.ar_backend, set()) if stage.kind == "ar" else set()
    unsupported = [f"{name}={getattr(config, name)!r}" for name, inert in NOT_YET_IMPLEMENTED.items()
                   if name not in implemented and getattr(config, name) != inert]
    if unsupported:
        engine = f"the {config.ar_backend} AR engine" if stage.kind == "ar" else f"the {stage.kind} engine"
        raise ValueError(f"stage {stage.label}: {', '.join(unsupported)} is not implemented by {engine} in this "
                         f"version of omnistage (offload, fused LoRA and attention backends are "
                         f"diffusion-stage accelerations for now; quantization and LoRA adapters are the diffusion "
                         f"and native AR engines', compile is the diffusion and AR engines'; several devices run each batch on every rank, "
                         f"so a parallel degree would buy nothing); remove it from the deploy config")


def create_engine(model_path: str, stage: StageSpec, config: StageDeployConfig) -> Engine:
    """The default engine factory: the engine class of the stage's kind (and AR backend)."""
    check_implemented(stage, config)
    return get_engine_class(stage.kind, config.ar_backend)(model_path, stage, config)


def request_checker(factory: EngineFactory, model_path: str, stage: StageSpec,
                    config: StageDeployConfig) -> Callable[[StageRequest], None] | None:
    """The check the factory's engine runs on `add_request`, runnable where the orchestrator is
    (it raises RequestError), or None when the engine offers none. An engine class offers one
    with a `request_checker(model_path, stage, config)` classmethod."""
    if factory is create_engine:
        factory = get_engine_class(stage.kind, config.ar_backend)
    make = getattr(getattr(factory, "func", factory), "request_checker", None)  # a partial's class too
    return make(model_path, stage, config) if make is not None else None


def stage_model_paths(model_path: str, pipeline: PipelineSpec) -> dict[int, str]:
    """The checkpoint each stage loads: `model_path`, unless it is a pipeline folder.

    A pipeline made of several models is a local folder whose `config.json` names the
    registered pipeline and each stage's checkpoint by stage name: a path (relative to the
    folder, or absolute) or a hub id:

        {"model_type": "prompt_expand_image",
         "stage_models": {"expander": "qwen2-0.5b", "drawer": "/models/z-image-turbo"}}

    A stage it does not list loads `model_path` itself.
    """
    root = Path(model_path).expanduser()
    config_file = root / "config.json"
    stage_models = {}
    if config_file.is_file():
        stage_models = json.loads(config_file.read_text()).get("stage_models") or {}
    names = {stage.name for stage in pipeline.stages}
    unknown = sorted(set(stage_models) - names)
    if unknown:
        raise ValueError(f"{config_file}: stage_models names {unknown}, which are not stages of pipeline "
                         f"{pipeline.name!r} ({pipeline.describe_stages()})")
    paths = {}
    for stage in pipeline.stages:
        given = stage_models.get(stage.name)
        paths[stage.id] = model_path if given is None else str(root / given) if (root / given).exists() else given
    return paths
