"""`ulysses_degree: N` and `ring_degree: M`: the transformer's token sequence is split over
N x M ranks. Ulysses: attention exchanges heads with all-to-all so each rank attends over
the whole sequence for 1/N of the heads (DeepSpeed-Ulysses), joint text+image attention
included. Ring: key/value chunks go round the ring with an online softmax (ring_attention.py).

It is built on diffusers' own context-parallel machinery, configured through its public
pieces: the transformer's context-parallel plan (`_cp_plan`, which names where the sequence
is split and gathered) goes to `diffusers.hooks.context_parallel.apply_context_parallel`,
and each attention processor gets the stage's `ParallelConfig`, so the attention dispatcher
runs its Ulysses all-to-all around the ordinary attention op. `enable_parallelism` would do
the same, but it picks the device by dividing by the accelerator count (zero on CPU), so
this module sets the config up with the stage's own mesh (parallel_groups.py) and device.

Families: Wan (T2V, I2V), Qwen-Image (and Edit), FLUX and FLUX.2 use diffusers' plans; Z-Image's
transformer has none, so `_z_image_plan` splits its unified [image, caption] sequence
before the main layers and gathers it after them (the refiner layers run whole on every
rank). SD3 is refused: its joint attention processor calls SDPA directly, with no parallel
hook. `ring_degree` swaps in our own processors (ring_attention.py) for Z-Image and Wan, and
refuses Qwen-Image, FLUX and FLUX.2 by name: their joint-attention processors are not written here.
A head count the degree does not divide is refused at load time; a request whose
image or text token count it does not divide fails with both numbers named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.parallel_groups import Degrees, degrees_of, parallel_groups

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class SequenceParallelConfig:
    degrees: Degrees
    """All the stage's degrees: the sequence group is the ("ring", "ulysses") part of their mesh."""

    @property
    def ways(self) -> int:
        """How many pieces the sequence is cut into."""
        return self.degrees.ring * self.degrees.ulysses

    @property
    def field(self) -> str:
        names = {"ulysses_degree": self.degrees.ulysses, "ring_degree": self.degrees.ring}
        return " x ".join(f"{name}={value}" for name, value in names.items() if value > 1)


def from_deploy(deploy: StageDeployConfig) -> SequenceParallelConfig | None:
    if deploy.ulysses_degree == 1 and deploy.ring_degree == 1:
        return None
    return SequenceParallelConfig(degrees_of(deploy))


@dataclass(frozen=True)
class FamilyPlan:
    """How one transformer class is split: where (diffusers' plan) and what must divide."""

    plan: Callable[[Any], dict]
    """transformer -> its context-parallel plan (module name -> split inputs / gathered outputs)."""
    split_lengths: Callable[[Any, dict], dict[str, int]]
    """(transformer, forward kwargs) -> the token counts the plan splits, by what they count."""
    attention: Callable[[Any], list[Any]] = lambda model: list(model.modules())
    """The modules whose attention runs over the split sequence."""


def _wan_lengths(model: Any, kwargs: dict) -> dict[str, int]:
    _, _, frames, height, width = kwargs["hidden_states"].shape
    pt, ph, pw = model.config.patch_size
    return {"video tokens": (frames // pt) * (height // ph) * (width // pw)}


def _joint_lengths(model: Any, kwargs: dict) -> dict[str, int]:
    return {"image tokens": kwargs["hidden_states"].shape[1], "text tokens": kwargs["encoder_hidden_states"].shape[1]}


def _z_image_plan(model: Any) -> dict:
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    return {
        "layers.0": {"x": ContextParallelInput(split_dim=1, expected_dims=3)},
        # Every main layer is handed the whole sequence's RoPE frequencies: each takes its piece.
        "layers.*": {"freqs_cis": ContextParallelInput(split_dim=1, expected_dims=3)},
        f"layers.{len(model.layers) - 1}": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


Z_IMAGE_SEQ_MULTIPLE = 32
"""Z-Image pads its image and caption token runs to multiples of 32 (SEQ_MULTI_OF), so its
unified sequence always divides by a degree that divides 32."""

PLANS: dict[str, FamilyPlan] = {
    "WanTransformer3DModel": FamilyPlan(lambda model: model._cp_plan, _wan_lengths),
    "QwenImageTransformer2DModel": FamilyPlan(lambda model: model._cp_plan, _joint_lengths),
    "FluxTransformer2DModel": FamilyPlan(lambda model: model._cp_plan, _joint_lengths),
    "Flux2Transformer2DModel": FamilyPlan(lambda model: model._cp_plan, _joint_lengths),
    "ZImageTransformer2DModel": FamilyPlan(_z_image_plan, lambda model, kwargs: {},
                                           attention=lambda model: list(model.layers.modules())),
}
REFUSED = {
    "SD3Transformer2DModel": "its joint attention processor calls SDPA directly, with no sequence-parallel hook",
}


def transformers_of(pipeline: Any) -> list[Any]:
    """The pipeline's denoising transformers (Wan 2.2 has two experts)."""
    return [m for m in (getattr(pipeline, "transformer", None), getattr(pipeline, "transformer_2", None))
            if m is not None]


def apply(pipeline: Any, config: SequenceParallelConfig) -> None:
    from omnistage.diffusion.accel.ring_attention import RING_PROCESSORS

    field, ways, ulysses = config.field, config.ways, config.degrees.ulysses
    models = transformers_of(pipeline)
    if getattr(pipeline, "guidance", None) is None or not models:
        raise ValueError(f"{field}: {pipeline.reference_class} cannot split its token sequence (native families "
                         "with the shared guidance seam only: Wan, Qwen-Image, FLUX, Z-Image)")
    for model in models:
        name = type(model).__name__
        if name in REFUSED or name not in PLANS:
            why = REFUSED.get(name, "its transformer has no sequence-parallel plan here")
            raise ValueError(f"{field}: {pipeline.reference_class} ({name}) cannot take it: {why}")
        if config.degrees.ring > 1 and name not in RING_PROCESSORS:
            raise ValueError(f"ring_degree={config.degrees.ring}: {pipeline.reference_class} ({name}) cannot take "
                             "it: ring attention has processors for Z-Image and Wan only (use ulysses_degree)")
        heads = _attention_heads(model)
        if heads % ulysses:
            raise ValueError(f"ulysses_degree={ulysses} does not divide the {heads} attention heads of "
                             f"{pipeline.reference_class}")
        if name == "ZImageTransformer2DModel" and Z_IMAGE_SEQ_MULTIPLE % ways:
            raise ValueError(f"{field} splits the sequence {ways} ways, which does not divide "
                             f"{Z_IMAGE_SEQ_MULTIPLE}, the multiple Z-Image pads its token sequence to")
    groups = parallel_groups(config.degrees, pipeline.device)
    for model in models:
        ring = RING_PROCESSORS[type(model).__name__] if config.degrees.ring > 1 else None
        _enable(model, PLANS[type(model).__name__], groups, pipeline.device, config, ring)


def _attention_heads(model: Any) -> int:
    return next(m.heads for m in model.modules() if hasattr(m, "heads") and hasattr(m, "processor"))


def _enable(model: Any, family: FamilyPlan, groups: Any, device: torch.device, config: SequenceParallelConfig,
            ring_processor: Callable | None) -> None:
    import torch.distributed as dist
    from diffusers import ContextParallelConfig, ParallelConfig
    from diffusers.hooks.context_parallel import apply_context_parallel

    cp_config = ContextParallelConfig(ring_degree=config.degrees.ring, ulysses_degree=config.degrees.ulysses,
                                      mesh=groups.sequence_mesh)
    parallel_config = ParallelConfig(context_parallel_config=cp_config)
    parallel_config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=groups.sequence_mesh)
    model._parallel_config = parallel_config  # what enable_parallelism records
    for module in family.attention(model):
        processor = getattr(module, "processor", None)
        if processor is None or not hasattr(processor, "_parallel_config"):
            continue
        if ring_processor is not None:  # our processor computes Ulysses and ring itself
            module.set_processor(ring_processor(groups))
        else:  # diffusers' dispatcher runs Ulysses around the attention op
            processor._parallel_config = parallel_config
    # Our check runs before diffusers' split (its own is a bare assert).
    model.register_forward_pre_hook(_length_check(family, config), with_kwargs=True)
    apply_context_parallel(model, cp_config, family.plan(model))


def _length_check(family: FamilyPlan, config: SequenceParallelConfig) -> Callable:
    def check(model: Any, args: tuple, kwargs: dict) -> None:
        for what, length in family.split_lengths(model, kwargs).items():
            if length % config.ways:
                raise ValueError(f"{config.field} does not divide the {length} {what} of this request")
    return check
