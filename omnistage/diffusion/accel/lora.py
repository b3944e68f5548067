"""LoRA adapters in diffusers' safetensors format, loaded by diffusers' own LoRA loaders.

- `lora: [{path, scale}]` (static): each adapter is loaded, weighted by its scale and fused
  into the weights at load (`fuse_lora`), then its LoRA layers are dropped: the stage serves
  the merged model at the plain model's speed.
- `lora_adapters: {name: path}` (per request): the adapters are loaded side by side into
  the transformer (peft layers, unfused) and a request picks one with `lora: {name, scale}`
  (DiffusionParams / `extra_body`). Requests with different adapters never share a
  transformer call: the LoRA is part of the request-mode batch key, and in step mode the
  pipeline's step runner splits a step's states by adapter and activates each group's
  adapter (`set_adapters`, or `disable_lora` for requests without one) before its
  `denoise_step`. Per-request adapters may only touch the transformer: a text-encoder LoRA
  would have to follow the request into `encode` too, so it is refused by name.
- `max_loras: N` (hot): adapters are also loaded and unloaded while the stage serves
  (`AdapterSwitch.load` / `unload`, called by the worker). Which ones, and when, the engine
  decides (core/lora.py); here a failed load leaves nothing behind.

The loader is the family's diffusers pipeline class (`load_lora_weights`, which converts
the LoRA formats diffusers knows), built over our pipeline's own components, so the
adapters land in the modules that run. (The generic adapter declares no accelerations, so it
is refused before this runs; its own diffusers pipeline would be the loader.)
"""

from __future__ import annotations

import inspect
from pathlib import Path
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omnistage.core.lora import short_error

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.pipeline import DenoiseState


@dataclass(frozen=True)
class StaticLora:
    path: str
    scale: float = 1.0


@dataclass(frozen=True)
class LoraConfig:
    static: tuple[StaticLora, ...] = ()
    """Fused at load, in order."""
    adapters: tuple[tuple[str, str], ...] = ()
    """(name, path) of the adapters requests choose from."""
    max_loras: int = 0
    """Most adapters loaded by path while serving (0: none)."""


def from_deploy(deploy: StageDeployConfig) -> LoraConfig | None:
    static = tuple(StaticLora(str(e["path"]), float(e.get("scale", 1.0))) for e in deploy.lora or ())
    adapters = tuple(sorted(deploy.lora_adapters.items()))
    config = LoraConfig(static, adapters, deploy.max_loras)
    return config if static or adapters or config.max_loras else None


def apply(pipeline: Any, config: LoraConfig) -> None:
    loader = lora_loader(pipeline)
    if config.static:
        names = [f"static_{i}" for i in range(len(config.static))]
        for name, entry in zip(names, config.static):
            _load(loader, entry.path, name)
        loader.set_adapters(names, adapter_weights=[e.scale for e in config.static])
        loader.fuse_lora(adapter_names=names)
        loader.unload_lora_weights()  # the merged weights stay; the LoRA layers go
    if config.adapters or config.max_loras:
        field = "lora_adapters" if config.adapters else "max_loras"
        if "transformer" not in pipeline.components:
            raise ValueError(f"{field}: {pipeline.reference_class} has no transformer to switch adapters on")
        for name, path in config.adapters:
            _load(loader, path, name)
        _check_transformer_only(loader, "lora_adapters")
        pipeline.lora_adapters = tuple(name for name, _ in config.adapters)
        pipeline.max_loras = config.max_loras
        pipeline.step_runner = AdapterSwitch(pipeline.components["transformer"], loader)


def _check_transformer_only(loader: Any, field: str) -> None:
    outside = {component: names for component, names in loader.get_list_adapters().items()
               if component != "transformer" and names}
    if outside:
        raise ValueError(f"{field}: {outside} also adapt other components than the transformer; per-request "
                         f"adapters may only adapt the transformer (fuse the others with the static `lora` field)")


def _load(loader: Any, path: str, name: str) -> None:
    try:
        loader.load_lora_weights(path, adapter_name=name)
    except (OSError, ValueError) as exc:
        raise ValueError(f"lora: cannot load adapter {name!r} from {path}: {exc}") from exc


def lora_loader(pipeline: Any) -> Any:
    """The family's diffusers pipeline over our components: its `load_lora_weights` and
    friends act on the very modules our pipeline runs."""
    import diffusers

    pipe = getattr(pipeline, "pipe", None)  # the generic adapter already holds one
    if pipe is None:
        cls = getattr(diffusers, pipeline.reference_class, None)
        if cls is None or not hasattr(cls, "load_lora_weights"):
            raise ValueError(f"lora: {pipeline.reference_class} has no diffusers LoRA loader")
        accepted = inspect.signature(cls.__init__).parameters
        pipe = cls(**{k: v for k, v in pipeline.components.items() if k in accepted})
    if not hasattr(pipe, "load_lora_weights"):
        raise ValueError(f"lora: {type(pipe).__name__} has no diffusers LoRA loader")
    return pipe


def lora_file_problem(path: str) -> str | None:
    """Why `path` holds no diffusers LoRA file, or None: diffusers would take any other string
    for a hub repo id."""
    return None if Path(path).is_file() else f"no LoRA file {path!r} on the server"


def lora_key(state: DenoiseState) -> tuple[str, float] | None:
    lora = state.request.params.lora
    return None if lora is None else (lora.name, lora.scale)


class AdapterSwitch:
    """The pipeline's step runner with per-request adapters: one `denoise_step` per group of
    states sharing (adapter, scale), that adapter active on the transformer while it runs."""

    def __init__(self, transformer: Any, loader: Any):
        self.transformer = transformer
        self.loader = loader
        self.active: tuple[str, float] | None | str = "unset"

    def __call__(self, states: list[DenoiseState], denoise_step: Callable[[list[DenoiseState]], None]) -> None:
        from omnistage.diffusion.pipeline import group_by

        for group in group_by(states, lora_key):
            self.activate(lora_key(group[0]))
            denoise_step(group)

    def activate(self, key: tuple[str, float] | None) -> None:
        if key == self.active:
            return
        if key is None:
            if getattr(self.transformer, "peft_config", None):  # no adapter loaded yet: nothing to disable
                self.transformer.disable_lora()
        else:
            self.transformer.enable_lora()
            self.transformer.set_adapters([key[0]], weights=[key[1]])
        self.active = key

    def load(self, name: str, path: str) -> str | None:
        """Load adapter `name` from LoRA file `path` beside the others; the reason it cannot
        (a missing or unreadable file, an adapter for another model: shapes or module names
        that do not match), with nothing of it left loaded, or None."""
        problem = lora_file_problem(path)
        if problem is not None:
            return problem
        self.active = "unset"  # loading may change which adapters peft has active
        try:
            self.loader.load_lora_weights(path, adapter_name=name)
            _check_transformer_only(self.loader, "lora.path")
        except Exception as exc:  # noqa: BLE001 - any failure of the file is the caller's: report it
            self.unload(name)
            return f"cannot load adapter {name!r} from {path}: {short_error(exc)}"
        return None

    def unload(self, name: str) -> None:
        self.active = "unset"
        if any(name in names for names in self.loader.get_list_adapters().values()):
            self.loader.delete_adapters(name)
