"""Frozen pipeline topology: what a model *is* as a graph of stages.

A `PipelineSpec` is a DAG of `StageSpec`s. Construction validates the graph and raises
one `ValueError` that lists every problem found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

STAGE_KINDS = ("ar", "diffusion", "generation")
MODALITIES = ("text", "tokens", "image", "video", "audio", "latent")


@dataclass(frozen=True)
class StageSpec:
    id: int
    """Unique within the pipeline; deploy files and `--stage-overrides` address stages by it."""
    name: str
    """Human-readable name, e.g. "thinker"; params dicts may be keyed by it."""
    kind: str
    """Engine kind: one of STAGE_KINDS."""
    output: str
    """Output modality: one of MODALITIES, or a `+` combination such as "text+audio"."""
    inputs: tuple[int, ...] = ()
    """Upstream stage ids; empty for an entry stage."""
    final_output: bool = False
    """Whether this stage's outputs are returned to the user."""
    model: str | None = None
    """Key of the stage model implementation (registered by a `models/` family); None = generic."""
    input_processor: Callable[..., Any] | None = None
    """Builds this stage's input from upstream outputs: (request, {stage_id: payload}) -> input."""
    chunk_processor: Callable[..., Any] | None = None
    """Set on a stage that streams to downstream: (request, chunk payload) -> partial payload or None."""
    stream_input: bool = False
    """This stage accepts streamed chunks from its (single) upstream before it finishes."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Pipeline defaults for this stage's deploy fields (lowest precedence)."""
    hard: Mapping[str, Any] = field(default_factory=dict)
    """Deploy fields this stage forces whatever the user says (e.g. max_num_seqs=1)."""


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    stages: tuple[StageSpec, ...]
    request_extras: Mapping[str, Any] = field(default_factory=dict)
    """Model-declared request extras: name -> ExtraSpec (type, range, default)."""
