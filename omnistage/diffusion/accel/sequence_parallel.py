"""`ulysses_degree: N` and `ring_degree: M`: the transformer's token sequence is split over
N x M ranks. Ulysses: attention exchanges heads with all-to-all so each rank attends over
the whole sequence for 1/N of the heads (DeepSpeed-Ulysses), joint text+image attention
included. Ring: key/value chunks go round the ring with an online softmax (ring_attention.py).

It is built on diffusers' own context-parallel machinery, configured through its public
pieces: the transformer's context-parallel plan (`_cp_plan`, which names where the sequence
is split and gathered) goes to diffusers' split and gather hooks (sequence_split.py, which
pads), and each attention processor gets the stage's `ParallelConfig`, so the attention dispatcher
runs its Ulysses all-to-all around the ordinary attention op. `enable_parallelism` would do
the same, but it picks the device by dividing by the accelerator count (zero on CPU), so
this module sets the config up with the stage's own mesh (parallel_groups.py) and device.

A family takes it by declaring a `SequencePlan` (declaration.py) next to its pipeline: most
pass diffusers' own plan (`diffusers_plan`); Z-Image's and SD3's transformers have none, so
their families write one.
`ring_degree` needs the plan's ring processor (ring_attention.py computes the attention; the
family's processor calls it). A family whose plan `pads` (the joint text+image families:
Qwen-Image, FLUX, FLUX.2, SD3) runs that processor at every degree, and a token count the
degrees do not divide is padded and masked (sequence_split.py); for the others such a request
fails with both numbers named (Z-Image pads its own sequence to a multiple of 32). A head
count the Ulysses degree does not divide is refused at load time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.diffusion.accel.parallel_groups import Degrees, degrees_of, parallel_groups
from omnistage.diffusion.accel.sequence_split import SplitSequence, apply_plan

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig
    from omnistage.diffusion.accel.declaration import SequencePlan


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


def diffusers_plan(model: Any) -> dict:
    """The transformer class's own context-parallel plan (diffusers' `_cp_plan`)."""
    return model._cp_plan


def joint_lengths(model: Any, kwargs: dict) -> dict[str, int]:
    """The token counts of a joint text+image attention transformer (Qwen-Image, FLUX, FLUX.2)."""
    return {"image tokens": kwargs["hidden_states"].shape[1], "text tokens": kwargs["encoder_hidden_states"].shape[1]}


def transformers_of(pipeline: Any) -> list[Any]:
    """The pipeline's denoising transformers (Wan 2.2 has two experts)."""
    return [m for m in (getattr(pipeline, "transformer", None), getattr(pipeline, "transformer_2", None))
            if m is not None]


def apply(pipeline: Any, config: SequenceParallelConfig) -> None:
    field, ways, ulysses = config.field, config.ways, config.degrees.ulysses
    plan = pipeline.supported_accelerations.sequence_parallel
    models = transformers_of(pipeline)
    if plan is None or not models:  # check_declared refuses it first; this guards direct calls
        raise ValueError(f"{field}: {pipeline.reference_class} declares no sequence-parallel plan")
    if config.degrees.ring > 1 and plan.ring_processor is None:
        raise ValueError(f"ring_degree={config.degrees.ring}: {pipeline.reference_class} declares no ring "
                         "attention processor (use ulysses_degree)")
    for model in models:
        heads = _attention_heads(model)
        if heads % ulysses:
            raise ValueError(f"ulysses_degree={ulysses} does not divide the {heads} attention heads of "
                             f"{pipeline.reference_class}")
        if plan.sequence_multiple is not None and plan.sequence_multiple % ways:
            raise ValueError(f"{field} splits the sequence {ways} ways, which does not divide "
                             f"{plan.sequence_multiple}, the multiple {pipeline.reference_class} pads its "
                             "token sequence to")
    groups = parallel_groups(config.degrees, pipeline.device)
    for model in models:
        _enable(model, plan, groups, pipeline.device, config)


def _attention_heads(model: Any) -> int:
    return next(m.heads for m in model.modules() if hasattr(m, "heads") and hasattr(m, "processor"))


def _enable(model: Any, family: SequencePlan, groups: Any, device: torch.device,
            config: SequenceParallelConfig) -> None:
    import torch.distributed as dist
    from diffusers import ContextParallelConfig, ParallelConfig

    cp_config = ContextParallelConfig(ring_degree=config.degrees.ring, ulysses_degree=config.degrees.ulysses,
                                      mesh=groups.sequence_mesh)
    parallel_config = ParallelConfig(context_parallel_config=cp_config)
    parallel_config.setup(dist.get_rank(), dist.get_world_size(), device, mesh=groups.sequence_mesh)
    model._parallel_config = parallel_config  # what enable_parallelism records
    split = SplitSequence(groups, config.ways, cp_config)
    model._sequence_split = split  # for the step caches that keep a rank's shard (step_cache.py)
    # Ring, and padding (its mask), need the family's processor, which computes Ulysses and ring itself;
    # otherwise diffusers' dispatcher runs Ulysses around the attention op.
    own = config.degrees.ring > 1 or family.pads
    replaced = 0
    for module in family.attention(model):
        processor = getattr(module, "processor", None)
        if processor is None:
            continue
        if own:
            if (replacement := family.ring_processor(split, processor)) is not None:
                module.set_processor(replacement)
                replaced += 1
        elif hasattr(processor, "_parallel_config"):
            processor._parallel_config = parallel_config
    if own and not replaced:  # its attention would run over this rank's tokens alone
        raise ValueError(f"{config.field}: {type(model).__name__} has none of the attention processors its "
                         "family's ring processor replaces")
    # Runs before the split hooks (a torch pre-hook runs before the hooked forward).
    model.register_forward_pre_hook(_record_lengths(family, config, split), with_kwargs=True)
    apply_plan(model, cp_config, family.plan(model), split)


def _record_lengths(family: SequencePlan, config: SequenceParallelConfig, split: SplitSequence) -> Callable:
    def record(model: Any, args: tuple, kwargs: dict) -> None:
        lengths = family.split_lengths(model, kwargs)
        if family.pads:
            hidden = kwargs["hidden_states"]
            split.record(lengths, family.token_masks(model, kwargs), hidden.shape[0], hidden.device)
            return
        for what, length in lengths.items():
            if length % config.ways:
                raise ValueError(f"{config.field} does not divide the {length} {what} of this request")
    return record
