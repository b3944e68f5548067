"""What a diffusion family takes: `Accelerations`, declared by each native pipeline class next
to its code (`DiffusionPipelineBase.supported_accelerations`), and read here.

The modules of this package apply an acceleration; the family says whether it takes it. A
deploy field that turns on an acceleration the stage's family does not declare is refused
at start-up (`check_declared`, from the engine before anything loads, and again in
`DiffusionPipelineBase.from_pretrained`), with an error naming the field, the family and,
where the family gives one, the reason. The support matrix (`omnistage models`,
docs/reference/support.md) is generated from the same declarations.

Torch-free: the engine process checks a stage with it before any worker loads weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

CACHE_BACKENDS = ("first_block_cache", "tea_cache", "easycache", "mag_cache", "cache_dit")
"""Values of `cache_backend`, each the module of the same name."""


@dataclass(frozen=True)
class SequencePlan:
    """How a family's transformer splits its token sequence over ranks (sequence_parallel.py)."""

    plan: Callable[[Any], dict]
    """transformer -> its context-parallel plan (module name -> split inputs / gathered outputs),
    diffusers' `_cp_plan` or one the family writes."""
    split_lengths: Callable[[Any, dict], dict[str, int]]
    """(transformer, forward kwargs) -> the token counts the plan splits, by what they count."""
    attention: Callable[[Any], list[Any]] = lambda model: list(model.modules())
    """The modules whose attention runs over the split sequence."""
    sequence_multiple: int | None = None
    """The multiple the transformer pads its sequence to, which the degrees must divide (Z-Image: 32)."""
    ring_processor: Callable[[Any, Any], Any] | None = None
    """(the split (sequence_split.SplitSequence), an attention module's processor) -> the processor
    that replaces it, running Ulysses and ring attention through the split (ring_attention.py), or
    None to leave that module alone; None = `ring_degree` is refused (Ulysses only)."""
    pads: bool = False
    """Token counts the degrees do not divide are padded (sequence_split.py): the ring processor
    then runs at every degree and masks the padding out of the attention keys; the plan gathers
    the first sequence of `split_lengths`. False: such a request fails, naming both numbers."""
    token_masks: Callable[[Any, dict], dict] = lambda model, kwargs: {}
    """(transformer, forward kwargs) -> the request's own token masks of a split sequence, by the
    name `split_lengths` gives it (Qwen-Image's mask over batched prompts of different lengths)."""


@dataclass(frozen=True)
class TensorPlan:
    """Which Linear layers of a family's transformer blocks are sharded over ranks (tensor_parallel.py).

    Names are paths inside one block. A column layer keeps a slice of its output features (the
    QKV and first MLP projections: whole heads, whole hidden units), a row layer the matching
    slice of its input features, and its partial outputs are summed over the ranks (the output
    projection and second MLP projection)."""

    blocks: Callable[[Any], list[Any]]
    """transformer -> the blocks whose layers are sharded."""
    column: tuple[str, ...]
    """Layers split by output features."""
    row: tuple[str, ...]
    """Layers split by input features, then all-reduced."""
    attention: tuple[str, ...]
    """Attention modules whose heads the column layers split: N must divide their `heads`."""
    local_heads: bool = True
    """Set their `heads` to heads / N, for processors that cut the QKV by `heads` (Z-Image); False
    where the processor cuts it by head size and would read `heads` for that (Qwen-Image, FLUX)."""
    row_parts: Callable[[Any, str], list[int] | None] = lambda block, name: None
    """(block, row layer) -> the widths of the column outputs its input concatenates, each
    sharded alike (FLUX's single blocks: attention output, then MLP), or None for one."""
    column_parts: Callable[[Any, str], list[int] | None] = lambda block, name: None
    """(block, column layer) -> the widths of the parts its output concatenates, each sharded
    alike (FLUX.2's fused QKV + MLP projection, its SwiGLU's gate and value halves), or None for one."""
    norms: tuple[str, ...] = ()
    """RMSNorms over a column layer's whole output, across heads (Wan's q/k norms): each keeps
    its slice of the weight and all-reduces the sum of squares, so a shard normalises exactly."""
    gathered: tuple[str, ...] = ()
    """Layers split by output features whose small output every rank needs whole: all-gathered
    (the adaLN modulation of each block, computed once per step from the timestep embedding)."""


@dataclass(frozen=True)
class Accelerations:
    """The accelerations a family takes. Anything left at its default is refused by name."""

    step_caches: tuple[str, ...] = ()
    """Values of `cache_backend` it takes; the blocks they hook are the pipeline's
    `step_cache_blocks` (with TeaCache's modulated input and coefficients)."""
    cfg_parallel: bool = False
    """`cfg_parallel_size: 2`: its CFG branches run on two ranks (needs a `guidance`)."""
    sequence_parallel: SequencePlan | None = None
    """`ulysses_degree` (and `ring_degree` when the plan has a ring processor)."""
    tensor_parallel: tuple[TensorPlan, ...] = ()
    """`tensor_parallel_size`: its transformer blocks' Linear layers sharded over ranks, one plan
    per kind of block."""
    fsdp: bool = False
    """`fsdp_degree`: its transformers' weights sharded over ranks with FSDP2, one unit per block
    of diffusers' `_repeated_blocks` (fsdp.py)."""
    vae_tiling: bool = False
    """`vae_use_tiling` and `vae_use_slicing`: its VAE's own tiled and sliced encode and decode."""
    vae_patch_parallel: bool = False
    """`vae_patch_parallel_size`: the tiles of its VAE decode shared out over ranks."""
    offload: bool = False
    """`offload: model | layerwise`."""
    quantization: bool = False
    """`quantization`: int8 / fp8 of its transformer's linear layers, weight-only or dynamic."""
    lora: bool = False
    """`lora`, `lora_adapters` and `max_loras`, through its diffusers pipeline's LoRA loader."""
    compile: bool = False
    """`compile: true`: regional compile of its transformer's repeated blocks."""
    refused: Mapping[str, str] = field(default_factory=dict)
    """Deploy field -> why the family cannot take it, for the error and the support matrix."""

    @property
    def ring(self) -> bool:
        return self.sequence_parallel is not None and self.sequence_parallel.ring_processor is not None

    def names(self) -> list[str]:
        """The deploy fields (and cache backends) it takes, for messages and the matrix."""
        fields = [name for name, taken in (
            ("cfg_parallel_size", self.cfg_parallel), ("ulysses_degree", self.sequence_parallel is not None),
            ("ring_degree", self.ring), ("tensor_parallel_size", bool(self.tensor_parallel)),
            ("fsdp_degree", self.fsdp), ("vae_use_tiling", self.vae_tiling), ("vae_use_slicing", self.vae_tiling),
            ("vae_patch_parallel_size", self.vae_patch_parallel), ("offload", self.offload),
            ("quantization", self.quantization), ("lora", self.lora), ("compile", self.compile)) if taken]
        return ([f"cache_backend ({', '.join(self.step_caches)})"] if self.step_caches else []) + fields


NONE = Accelerations()
"""What a pipeline that declares nothing takes: nothing (the generic adapter, a new family)."""


def requested(deploy: StageDeployConfig) -> list[tuple[str, Any]]:
    """(deploy field, its value) for every acceleration field the deploy config turns on."""
    on = [
        ("cache_backend", deploy.cache_backend is not None, deploy.cache_backend),
        ("cfg_parallel_size", deploy.cfg_parallel_size > 1, deploy.cfg_parallel_size),
        ("ulysses_degree", deploy.ulysses_degree > 1, deploy.ulysses_degree),
        ("ring_degree", deploy.ring_degree > 1, deploy.ring_degree),
        ("tensor_parallel_size", deploy.tensor_parallel_size > 1, deploy.tensor_parallel_size),
        ("fsdp_degree", deploy.fsdp_degree > 1, deploy.fsdp_degree),
        ("vae_use_tiling", deploy.vae_use_tiling, deploy.vae_use_tiling),
        ("vae_use_slicing", deploy.vae_use_slicing, deploy.vae_use_slicing),
        ("vae_patch_parallel_size", deploy.vae_patch_parallel_size > 1, deploy.vae_patch_parallel_size),
        ("offload", deploy.offload is not None, deploy.offload),
        ("quantization", deploy.quantization is not None, deploy.quantization),
        ("lora", bool(deploy.lora), "[...]"),
        ("lora_adapters", bool(deploy.lora_adapters), "{...}"),
        ("max_loras", deploy.max_loras > 0, deploy.max_loras),
        ("compile", deploy.compile, deploy.compile),
    ]
    return [(name, value) for name, is_on, value in on if is_on]


def takes(decl: Accelerations, name: str, value: Any) -> bool:
    """Whether a family with `decl` takes deploy field `name` set to `value`."""
    return {
        "cache_backend": value in decl.step_caches,
        "cfg_parallel_size": decl.cfg_parallel,
        "ulysses_degree": decl.sequence_parallel is not None,
        "ring_degree": decl.ring,
        "tensor_parallel_size": bool(decl.tensor_parallel),
        "fsdp_degree": decl.fsdp,
        "vae_use_tiling": decl.vae_tiling,
        "vae_use_slicing": decl.vae_tiling,
        "vae_patch_parallel_size": decl.vae_patch_parallel,
        "offload": decl.offload,
        "quantization": decl.quantization,
        "lora": decl.lora,
        "lora_adapters": decl.lora,
        "max_loras": decl.lora,
        "compile": decl.compile,
    }[name]


def check_declared(family: str, decl: Accelerations, deploy: StageDeployConfig) -> None:
    """ValueError naming every acceleration field `deploy` sets that `family` does not declare."""
    problems = []
    for name, value in requested(deploy):
        if takes(decl, name, value):
            continue
        why = decl.refused.get(name) or decl.refused.get(f"{name}: {value}")
        problems.append(f"{name}={value!r}: {family} cannot take it" + (f": {why}" if why else ""))
    if problems:
        taken = ", ".join(decl.names()) or "none"
        raise ValueError(f"{'; '.join(problems)} (it takes: {taken})")
