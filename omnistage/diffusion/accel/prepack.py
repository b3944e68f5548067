"""`prepack_linears: true` (off by default for diffusion): on CPU, the linear layers of the
transformer's blocks run through oneDNN with their weights packed once at load (core/cpu_linear.py),
about 2x torch's matmul on a DiT's hundreds to thousands of token rows; results differ by rounding
only, but that rounding depends on the batch: a request's image batched with others differs from
the same request alone by one 8-bit level (tests/api/test_real_models.py holds the default to
batch-independent output), so it is an opt-in.

Only the blocks are packed: those of the classes the transformer lists in diffusers'
`_repeated_blocks` (Z-Image's refiners too) and the block lists the family names for the step
caches (`step_cache_blocks`). They hold nearly all the weights and only call their linears. The
glue around them is left as loaded, since some of it reads a linear's `.weight` (Z-Image's
timestep embedder its dtype, Wan's the first parameter of its time embedder), which a packed
layer no longer has (keeping it would double the memory).

A stage whose linears something else wraps, shards, moves or replaces is left unpacked, saying
so in a debug log: see `LEFT_UNPACKED_WITH`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from omnistage.core.cpu_linear import MIN_PACKED_WEIGHT_TOKEN_ROWS, prepack_linears
from omnistage.core.device import resolve_device
from omnistage.diffusion.accel.declaration import requested

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig

logger = logging.getLogger(__name__)

LEFT_UNPACKED_WITH: dict[str, str] = {
    "lora": "peft wraps each nn.Linear to fuse the adapters",
    "lora_adapters": "peft wraps each nn.Linear",
    "max_loras": "peft wraps each nn.Linear as adapters load",
    "quantization": "its own layers replace the linears",
    "transformer_file": "GGUF layers hold quantized weights",
    "tensor_parallel_size": "its shards read and replace the linears' weights",
    "fsdp_degree": "FSDP2 shards the weights as parameters",
    "offload": "its hooks move the weights between devices",
    "compile": "inductor cannot lower the packed op with a packed weight as input (LoweringException, torch 2.13)",
}
"""Deploy fields that leave the transformer unpacked, and why. Ulysses and ring attention are not
here: they split the sequence around the blocks and never touch a linear."""


@dataclass(frozen=True)
class PrepackConfig:
    min_weight: int = MIN_PACKED_WEIGHT_TOKEN_ROWS
    """The fewest weight elements packed: every block matmul sees the tokens' rows."""


def from_deploy(deploy: StageDeployConfig) -> PrepackConfig | None:
    if deploy.prepack_linears is not True or resolve_device(deploy.devices).type != "cpu":
        return None
    on = [name for name, _ in requested(deploy)] + (["transformer_file"] if deploy.transformer_file else [])
    clashing = [name for name in on if name in LEFT_UNPACKED_WITH]
    if clashing:
        logger.debug("prepack_linears: the transformer is left unpacked: %s",
                     "; ".join(f"{name} ({LEFT_UNPACKED_WITH[name]})" for name in clashing))
        return None
    return PrepackConfig()


def apply(pipeline: Any, config: PrepackConfig) -> None:
    if pipeline.device.type != "cpu":
        logger.debug("prepack_linears: %s is left unpacked (not on CPU)", pipeline.reference_class)
        return
    blocks = transformer_blocks(pipeline)
    num = sum(prepack_linears(block, min_weight=config.min_weight) for block in blocks)
    logger.debug("prepack_linears: %d linear layers of %s's transformer blocks packed%s", num,
                 pipeline.reference_class, "" if blocks else " (it declares no transformer blocks)")


def transformer_blocks(pipeline: Any) -> list[torch.nn.Module]:
    """The blocks of the pipeline's transformers (Wan 2.2 has two): the modules of their
    `_repeated_blocks` classes and the block lists of `step_cache_blocks`."""
    chain = pipeline.step_cache_blocks
    blocks = []
    for name, model in pipeline.components.items():
        if not (name.startswith("transformer") and isinstance(model, torch.nn.Module)):
            continue
        repeated = set(getattr(model, "_repeated_blocks", None) or ())
        blocks += [m for m in model.modules() if type(m).__name__ in repeated]
        if chain is not None and name in chain.transformers:
            blocks += [getattr(model, attr) for attr in chain.blocks if isinstance(getattr(model, attr, None),
                                                                                   torch.nn.Module)]
    return blocks
