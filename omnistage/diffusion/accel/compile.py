"""`compile: true`: regional `torch.compile` of the transformer's repeated blocks.

Only the blocks the model class lists in diffusers' `_repeated_blocks` are compiled
(`ModelMixin.compile_repeated_blocks`): every block of a class shares one compiled graph,
so compile time is that of one block, not of the whole model, and the glue between blocks
(embeddings, RoPE, patching) stays eager.

Shapes: step mode changes the number of rows from one step to the next, and requests of
other sizes change the token count. The blocks are compiled with `dynamic=None`, torch's
automatic dynamic shapes: the first shape compiles a static graph, the first change of a
dimension recompiles once with that dimension symbolic, and from then on every size
reuses it, so the number of graphs is bounded by (shapes of the first call + dimensions
that vary), not by the number of batch sizes seen (benchmarks/RESULTS.md has the count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omnistage.config.deploy_fields import StageDeployConfig


@dataclass(frozen=True)
class CompileConfig:
    backend: Any = "inductor"
    """torch.compile backend (a name or a callable; tests count graphs with a counting one)."""
    dynamic: bool | None = None
    """None: automatic dynamic shapes (see the module docstring)."""


def from_deploy(deploy: StageDeployConfig) -> CompileConfig | None:
    return CompileConfig() if deploy.compile else None


def apply(pipeline: Any, config: CompileConfig) -> None:
    models = {name: c for name, c in pipeline.components.items()
              if name.startswith("transformer") and getattr(c, "_repeated_blocks", None)}
    if not models:
        raise ValueError(f"compile: {pipeline.reference_class} has no transformer that declares its repeated "
                         "blocks (diffusers' `_repeated_blocks`), so there is no region to compile")
    for model in models.values():
        model.compile_repeated_blocks(backend=config.backend, dynamic=config.dynamic)


def compiled_blocks(pipeline: Any) -> list[str]:
    """Names of the modules compiled in place (`nn.Module.compile`)."""
    return [f"{name}.{sub}" for name, c in pipeline.components.items() if hasattr(c, "named_modules")
            for sub, m in c.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]
