"""`attention_backend`: which attention kernel the transformer's attention runs on.

The kernels are diffusers' attention dispatcher's (`ModelMixin.set_attention_backend`);
this module is the registry of our names for them and of what each needs, so that a
name the platform cannot run is refused at load with the list of those it can, rather
than failing inside the first request. `sdpa` (torch's scaled_dot_product_attention,
which picks its own kernel) is the default and always available. Families whose
attention processors do not go through the dispatcher (SD3's joint attention calls
torch directly) are refused by name for anything but `sdpa`.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class Backend:
    dispatcher_name: str
    """diffusers' `AttentionBackendName` value."""
    package: str | None = None
    """The module it needs importable (None: torch alone)."""
    needs_cuda: bool = False


BACKENDS: dict[str, Backend] = {
    "sdpa": Backend("native"),
    "sdpa_math": Backend("_native_math"),
    "sdpa_flash": Backend("_native_flash", needs_cuda=True),
    "sdpa_efficient": Backend("_native_efficient", needs_cuda=True),
    "sdpa_cudnn": Backend("_native_cudnn", needs_cuda=True),
    "flex": Backend("flex"),
    "flash_attn": Backend("flash", package="flash_attn", needs_cuda=True),
    "flash_attn_varlen": Backend("flash_varlen", package="flash_attn", needs_cuda=True),
    "flash_attn_3": Backend("_flash_3", package="flash_attn_interface", needs_cuda=True),
    "sage": Backend("sage", package="sageattention", needs_cuda=True),
    "sage_varlen": Backend("sage_varlen", package="sageattention", needs_cuda=True),
    "xformers": Backend("xformers", package="xformers", needs_cuda=True),
}
"""Our backend names -> diffusers' dispatcher backends. The `*_hub` ones are left out: they
download kernels at run time, which a server must not depend on."""

DEFAULT = "sdpa"


def is_available(name: str) -> bool:
    backend = BACKENDS[name]
    if backend.needs_cuda and not torch.cuda.is_available():
        return False
    if name == "flex" and not hasattr(torch.nn.attention, "flex_attention"):
        return False
    return backend.package is None or importlib.util.find_spec(backend.package) is not None


def available_backends() -> list[str]:
    """The backends this machine can run, default first."""
    return [name for name in BACKENDS if is_available(name)]


@dataclass(frozen=True)
class AttentionBackendConfig:
    name: str


def from_deploy(deploy: StageDeployConfig) -> AttentionBackendConfig | None:
    return None if deploy.attention_backend == DEFAULT else AttentionBackendConfig(deploy.attention_backend)


def check_backend(name: str) -> Backend:
    """The registry entry of `name`; ValueError naming it and the available ones otherwise."""
    available = ", ".join(available_backends())
    if name not in BACKENDS:
        raise ValueError(f"attention_backend: unknown backend {name!r}; available here: {available}")
    if not is_available(name):
        backend = BACKENDS[name]
        needs = " and ".join(filter(None, [backend.package and f"the {backend.package} package",
                                           backend.needs_cuda and "a CUDA device"]))
        raise ValueError(f"attention_backend: {name!r} needs {needs}; available here: {available}")
    return BACKENDS[name]


def dispatched_models(pipeline: Any) -> dict[str, Any]:
    """The pipeline's components whose attention goes through diffusers' dispatcher."""
    out = {}
    for name, component in pipeline.components.items():
        if not hasattr(component, "set_attention_backend"):
            continue
        processors = [m.processor for m in component.modules() if hasattr(m, "processor")]
        if any(hasattr(p, "_attention_backend") for p in processors):
            out[name] = component
    return out


def apply(pipeline: Any, config: AttentionBackendConfig) -> None:
    backend = check_backend(config.name)
    models = dispatched_models(pipeline)
    if not models:
        raise ValueError(f"attention_backend: {pipeline.reference_class}'s attention does not go through "
                         f"diffusers' attention dispatcher; only {DEFAULT!r} is supported for it")
    for model in models.values():
        model.set_attention_backend(backend.dispatcher_name)


def active_backends(pipeline: Any) -> set[str]:
    """The dispatcher backends the pipeline's attention processors are set to (None: the default)."""
    processors = [m.processor for model in dispatched_models(pipeline).values() for m in model.modules()
                  if hasattr(getattr(m, "processor", None), "_attention_backend")]
    return {getattr(p._attention_backend, "value", p._attention_backend) for p in processors}
